package main

import (
	"os"
	"runtime"
)

// extraProcs is how many Ps (Go's processors, GOMAXPROCS) the binary runs
// beyond the runtime's default, the CPUs it may use. A P whose goroutine
// is in a blocking system call (Pebble's WAL writer in fdatasync, 0.2–0.5
// ms on this machine, and its flushes' and compactions' file writes) goes
// to other goroutines only when the runtime's monitor next takes it back
// (golang/go#18236), so on a 2-CPU machine two such calls held every
// runnable goroutine: a Raft message's sender waited 0.7–0.8 ms to run
// after its leader queued it. Under 16 clients on the embedded cluster a
// commit's epoch read took 2.4–3.0 ms with 2 Ps and 0.56–0.70 ms with 4,
// and throughput rose 1.07–3.0× in 6 alternating pairs (issue 17). The
// threads in those calls sleep in the kernel: the extra Ps cost no CPU of
// their own.
const extraProcs = 2

// procsFor returns the GOMAXPROCS the binary sets given the GOMAXPROCS
// environment variable env and the runtime's default def: def+extraProcs,
// or 0 (leave it) when env is set, the operator's choice.
func procsFor(env string, def int) int {
	if env != "" {
		return 0
	}
	return def + extraProcs
}

// setProcs sets GOMAXPROCS as procsFor says.
func setProcs() {
	if n := procsFor(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); n > 0 {
		runtime.GOMAXPROCS(n)
	}
}
