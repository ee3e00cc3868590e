package main

import "testing"

// TestProcsAreRaisedUnlessTheOperatorSetsThem: the binary runs extraProcs
// Ps beyond the runtime's default, and leaves GOMAXPROCS alone when the
// environment sets it.
func TestProcsAreRaisedUnlessTheOperatorSetsThem(t *testing.T) {
	if got := procsFor("", 2); got != 2+extraProcs {
		t.Errorf("procsFor(unset, 2) = %d; want %d", got, 2+extraProcs)
	}
	if got := procsFor("3", 2); got != 0 {
		t.Errorf("procsFor(\"3\", 2) = %d; want 0 (the environment's 3 stands)", got)
	}
}
