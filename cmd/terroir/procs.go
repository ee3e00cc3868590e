package main

import (
	"fmt"
	"os"
	"runtime"
	"time"

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

// binaryProcs is the controller of the binary's Ps (startProcs; nil when
// none runs, as under go test): the benchmarks say how long it ran the
// extra ones.
var binaryProcs *procs.Controller

// startProcs starts the controller of the binary's Ps, or returns nil when
// the environment sets GOMAXPROCS. It is the binary's: main calls it once.
func startProcs() *procs.Controller {
	p, ok := procsPolicy(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0))
	if !ok {
		return nil
	}
	binaryProcs = procs.Start(p)
	return binaryProcs
}

// procsExtraTime is how long the binary has run its extra Ps (0 when no
// controller runs).
func procsExtraTime() time.Duration {
	if binaryProcs == nil {
		return 0
	}
	return binaryProcs.ExtraTime()
}

// extraShare formats the share of a span of secs seconds, between two
// readings of procsExtraTime, that ran the extra Ps.
func extraShare(before, after time.Duration, secs float64) string {
	if binaryProcs == nil {
		return "none (GOMAXPROCS is fixed)"
	}
	return fmt.Sprintf("%.0f%% of the time", 100*(after-before).Seconds()/secs)
}
