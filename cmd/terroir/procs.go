package main

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/terroir-db/terroir/internal/procs"
)

// extraProcs is how many Ps (Go's processors, GOMAXPROCS) the binary adds
// to the runtime's default, the CPUs it may use, while runnable goroutines
// wait long for them (internal/procs says why and when).
const extraProcs = 2

// procsPolicy returns the policy the binary sizes its Ps by given the
// GOMAXPROCS environment variable env and the runtime's default def, and
// false when env is set: the operator's choice stands and nothing moves it.
func procsPolicy(env string, def int) (procs.Policy, bool) {
	if env != "" {
		return procs.Policy{}, false
	}
	return procs.DefaultPolicy(def, extraProcs), true
}

// binaryProcs is the controller of the binary's Ps (startProcs; nil when
// none runs, as under go test): the benchmarks say how long it ran the
// extra ones.
var binaryProcs *procs.Controller

// startProcs starts the controller of the binary's Ps (binaryProcs), unless
// the environment sets GOMAXPROCS. It is the binary's: main calls it once,
// and stopProcs before the process exits.
func startProcs() {
	if p, ok := procsPolicy(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); ok {
		binaryProcs = procs.Start(p)
	}
}

// stopProcs stops the controller startProcs started, if any.
func stopProcs() {
	if binaryProcs != nil {
		binaryProcs.Close()
	}
}

// procsExtraTime is how long the binary has run its extra Ps (0 when no
// controller runs).
func procsExtraTime() time.Duration {
	if binaryProcs == nil {
		return 0
	}
	return binaryProcs.ExtraTime()
}

// extraShare formats the share of the time between two samples that ran
// the extra Ps.
func extraShare(before, after runCost) string {
	span := after.at.Sub(before.at)
	if binaryProcs == nil || span <= 0 {
		return "none (GOMAXPROCS is fixed)"
	}
	return fmt.Sprintf("%.0f%% of the time", 100*float64(after.procsExtra-before.procsExtra)/float64(span))
}
