package node

import (
	"context"
	"sync"

	"github.com/terroir-db/terroir/internal/coordinator"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/txnstate"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// settler is the Settler of the node's txn-state cleaner (DESIGN.md §14):
// a coordinator in the node's region, made on first use — records left
// behind are rare — and closed with the node.
type settler struct {
	n      *Node
	region string

	mu sync.Mutex
	c  *coordinator.Coordinator
}

// Settle implements txnstate.Settler.
func (s *settler) Settle(ctx context.Context, rec *txnstatepb.Record) error {
	s.mu.Lock()
	if s.c == nil {
		c, err := coordinator.New(s.n.cfg.Topology, s.region, s.n.dialer)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		s.c = c
	}
	c := s.c
	s.mu.Unlock()
	return c.Settle(ctx, rec)
}

func (s *settler) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		s.c.Close()
	}
}

// cleanTxnRecords runs the cleaner of the node's txn-state replicas until
// the node stops.
func (n *Node) cleanTxnRecords(srv *txnstate.Server, region string) {
	s := &settler{n: n, region: region}
	defer s.close()
	top := n.cfg.Topology
	local := func(ctx context.Context, region string) (uint64, error) {
		r, err := n.reader(topology.KindLocalEpoch, region)
		if err != nil {
			return 0, err
		}
		return r.Read(ctx)
	}
	txnstate.NewCleaner(srv, s, txnstate.CleanerConfig{Grace: top.TxnRecordGrace, LocalEpoch: local}).Run(n.stopped)
}

// TxnRecords returns how many transaction records this node's txn-state
// replicas hold (DESIGN.md §14): records of transactions not yet
// forgotten, at most one per two-phase commit or orphan abort.
func (n *Node) TxnRecords() (int, error) {
	return n.txnSrv.Records()
}
