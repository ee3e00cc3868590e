package main

import "testing"

// TestProcsMoveUnlessTheOperatorSetsThem: the binary may add extraProcs Ps
// to the runtime's default, and leaves GOMAXPROCS alone when the
// environment sets it.
func TestProcsMoveUnlessTheOperatorSetsThem(t *testing.T) {
	p, ok := procsPolicy("", 2)
	if !ok || p.Base != 2 || p.Extra != extraProcs {
		t.Errorf("procsPolicy(unset, 2) = %+v, %v; want base 2, extra %d", p, ok, extraProcs)
	}
	if _, ok := procsPolicy("3", 2); ok {
		t.Errorf("procsPolicy(\"3\", 2) moves the Ps; want the environment's 3 to stand")
	}
}
