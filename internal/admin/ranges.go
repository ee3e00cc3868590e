package admin

import (
	"bytes"
	"context"
	"sort"
	"sync"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// RangeReport is one range as the cluster's nodes report it (`terroir admin
// range list`): the leader's report where the leader answered, else the
// newest-generation report of any replica.
type RangeReport struct {
	*pb.RangeStatus
	// Reporters is how many replicas answered for the range.
	Reporters int
}

// Ranges asks every node of top for the ranges it hosts and returns one
// report per range, ordered by start key; a range merged away (subsumed, by
// any replica's report) is left out. Nodes that do not answer by ctx's
// end are listed in down; their ranges are reported by the others.
func Ranges(ctx context.Context, d *transport.Dialer, top *topology.Topology) (ranges []RangeReport, down []uint64, err error) {
	var mu sync.Mutex
	byID := map[uint64]*RangeReport{}
	subsumed := map[uint64]bool{}
	var wg sync.WaitGroup
	for _, n := range top.Nodes {
		wg.Add(1)
		go func(id uint64) {
			defer wg.Done()
			var resp *pb.RangesResponse
			conn, err := d.Conn(id)
			if err == nil {
				resp, err = pb.NewRangeClient(conn).Ranges(ctx, &pb.RangesRequest{})
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				down = append(down, id)
				return
			}
			for _, st := range resp.GetRanges() {
				id := st.GetRangeDescriptor().GetRangeId()
				subsumed[id] = subsumed[id] || st.GetRangeDescriptor().GetSubsumed()
				cur := byID[id]
				switch {
				case cur == nil:
					byID[id] = &RangeReport{RangeStatus: st, Reporters: 1}
				case st.GetLeader() && !cur.GetLeader(),
					!cur.GetLeader() && st.GetRangeDescriptor().GetGeneration() > cur.GetRangeDescriptor().GetGeneration():
					byID[id] = &RangeReport{RangeStatus: st, Reporters: cur.Reporters + 1}
				default:
					cur.Reporters++
				}
			}
		}(n.ID)
	}
	wg.Wait()
	for id, r := range byID {
		if !subsumed[id] {
			ranges = append(ranges, *r)
		}
	}
	sort.Slice(ranges, func(i, j int) bool {
		return bytes.Compare(ranges[i].GetRangeDescriptor().GetStartKey(), ranges[j].GetRangeDescriptor().GetStartKey()) < 0
	})
	sort.Slice(down, func(i, j int) bool { return down[i] < down[j] })
	return ranges, down, ctx.Err()
}
