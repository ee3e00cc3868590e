package main

import (
	"os"
	"runtime"

	"github.com/terroir-db/terroir/internal/procs"
)

// extraProcs is how many Ps (Go's processors, GOMAXPROCS) the binary adds
// to the runtime's default, the CPUs it may use, while goroutines queue
// for them (internal/procs says why and when).
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

// startProcs starts the controller of the binary's Ps, or returns nil when
// the environment sets GOMAXPROCS.
func startProcs() *procs.Controller {
	p, ok := procsPolicy(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0))
	if !ok {
		return nil
	}
	return procs.Start(p)
}
