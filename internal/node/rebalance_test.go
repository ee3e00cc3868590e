package node

import (
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/topology"
)

// TestStreamTimeoutCoversAFullRangeSnapshot: the replicate queue gives a
// move twice what streaming a range of 1.25 × split_size (about twice that
// as read) takes when max_snapshots moves share the default snapshot rate,
// and never less than 30 s.
func TestStreamTimeoutCoversAFullRangeSnapshot(t *testing.T) {
	for _, c := range []struct {
		split uint64
		moves int
		want  time.Duration
	}{
		{topology.DefaultSplitSize, topology.DefaultMaxSnapshots, 160 * time.Second},
		{topology.DefaultSplitSize, 4, 320 * time.Second},
		{0, 2, 160 * time.Second}, // split_size off: the default's ranges
		{1 << 20, 2, 30 * time.Second},
	} {
		if got := streamTimeout(&topology.Topology{SplitSize: c.split, MaxSnapshots: c.moves}); got != c.want {
			t.Errorf("split_size %d, max_snapshots %d: %v, want %v", c.split, c.moves, got, c.want)
		}
	}
}
