package routing

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// nodesTimeout bounds one round of asking the nodes.
const nodesTimeout = 2 * time.Second

// NodesResolver resolves a miss by asking every node of the topology which
// ranges it hosts (the Range service's Ranges call) and returning every
// descriptor they report; the cache keeps the newest generation of each span.
// The replicated directory answers in one call instead; this is its
// fallback when no directory replica answers (a region without quorum),
// and admin commands ask it for the replicas' own view. When no node
// answers, or none serves the key (a merge between its halves), it is
// ErrNoRange, and the caller retries.
type NodesResolver struct {
	Topology *topology.Topology
	Dialer   *transport.Dialer
}

// Resolve implements Resolver.
func (r NodesResolver) Resolve(ctx context.Context, key []byte) ([]*pb.RangeDescriptor, error) {
	ctx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	var mu sync.Mutex
	var out []*pb.RangeDescriptor
	holds, answered := false, false
	var wg sync.WaitGroup
	for _, n := range r.Dialer.Network().Nodes() {
		wg.Add(1)
		go func(id uint64) {
			defer wg.Done()
			conn, err := r.Dialer.Conn(id)
			if err != nil {
				return
			}
			resp, err := pb.NewRangeClient(conn).Ranges(ctx, &pb.RangesRequest{})
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			answered = true
			for _, st := range resp.GetRanges() {
				d := st.GetRangeDescriptor()
				out = append(out, d)
				holds = holds || (Contains(d, key) && !d.GetSubsumed())
			}
		}(n.ID)
	}
	wg.Wait()
	if !answered {
		return nil, fmt.Errorf("%w: %q (no node answered)", ErrNoRange, key)
	}
	if !holds {
		return nil, fmt.Errorf("%w: %q (no node serves it now)", ErrNoRange, key)
	}
	return out, nil
}
