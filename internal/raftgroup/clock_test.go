package raftgroup

import (
	"slices"
	"testing"
	"time"
)

// The replicas of one group on different nodes tick at different instants
// of each Raft clock period: two followers that drew the same election
// timeout then still campaign apart instead of splitting the vote. Any
// two of nine nodes are at least a twentieth of a period apart.
func TestNodesTickTheirRaftClocksApart(t *testing.T) {
	period := clockTicks * 10 * time.Millisecond
	var phases []time.Duration
	for self := uint64(1); self <= 9; self++ {
		p := clockPhase(self, period)
		if p < 0 || p >= period {
			t.Fatalf("node %d: phase %v outside [0, %v)", self, p, period)
		}
		phases = append(phases, p)
	}
	slices.Sort(phases)
	for i := range phases {
		next := period + phases[0]
		if i+1 < len(phases) {
			next = phases[i+1]
		}
		if gap := next - phases[i]; gap < period/20 {
			t.Errorf("phases %v: two nodes tick %v apart, under %v", phases, gap, period/20)
		}
	}
}
