package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/txnstate"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
	"google.golang.org/protobuf/proto"
)

// Forgetting transaction records (DESIGN.md §14): once every participant
// of a two-phase commit has applied the outcome, the coordinator lets the
// transaction state store forget the record, in batches, forgetGrace
// after the first of a batch. A forget that fails is left to the store's
// cleaner.
const (
	forgetGrace   = time.Second
	forgetChunk   = 1000 // transaction IDs per Forget call
	forgetTimeout = 5 * time.Second
)

// forgetter batches the IDs of finished transactions for one txn-state
// group. Its timer's goroutine is the only one it starts; close waits
// for it.
type forgetter struct {
	client *txnstate.Client

	mu     sync.Mutex
	ids    [][]byte
	timer  *time.Timer
	closed bool
	wg     sync.WaitGroup // a flush scheduled or running
}

// add schedules txnID's record to be forgotten within forgetGrace.
func (f *forgetter) add(txnID []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.ids = append(f.ids, txnID)
	if f.timer == nil {
		f.wg.Add(1)
		f.timer = time.AfterFunc(forgetGrace, f.flush)
	}
}

// flush sends the batch gathered so far.
func (f *forgetter) flush() {
	defer f.wg.Done()
	f.mu.Lock()
	ids := f.ids
	f.ids, f.timer = nil, nil
	f.mu.Unlock()
	f.send(ids, forgetTimeout)
}

func (f *forgetter) send(ids [][]byte, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for len(ids) > 0 {
		n := min(len(ids), forgetChunk)
		if err := f.client.Forget(ctx, ids[:n]); err != nil {
			return // the store's cleaner forgets them later
		}
		ids = ids[n:]
	}
}

// close sends what is pending at once (bounded by a second) and stops.
func (f *forgetter) close() {
	f.mu.Lock()
	f.closed = true
	var ids [][]byte
	if f.timer != nil && f.timer.Stop() {
		f.wg.Done() // the scheduled flush will not run: send its batch here
		ids, f.ids, f.timer = f.ids, nil, nil
	}
	f.mu.Unlock()
	f.wg.Wait()
	f.send(ids, time.Second)
}

// ErrUnsettled: a transaction record that Settle cannot drive to its
// participants (one without their start keys and regions); it stays.
var ErrUnsettled = errors.New("coordinator: the record does not name its participants' spans")

// Settle tells every participant of rec, a committed transaction's record
// its coordinator did not forget, the commit — as the coordinator does
// after its commit point — at the range that now holds the participant's
// start key (its own, or the one that merged it), and returns nil once
// every one of them answered that it holds no prepared record of it any
// more (DESIGN.md §14). The transaction state store's cleaner calls it
// before forgetting the record. Errors: ErrUnsettled, the first
// participant's failure.
func (c *Coordinator) Settle(ctx context.Context, rec *txnstatepb.Record) error {
	v := rec.GetVersion()
	for _, p := range rec.GetParticipants() {
		if p.GetRegion() == "" {
			return fmt.Errorf("%w: range %d of transaction %x", ErrUnsettled, p.GetRangeId(), rec.GetTxnId())
		}
		req := &pb.CommitRequest{TxnId: rec.GetTxnId(), Version: &pb.VersionID{Epoch: v.GetEpoch(), Counter: v.GetCounter()}}
		if rv := p.GetRegionalVersion(); rv != nil {
			req.RegionalVersion = &pb.VersionID{Epoch: rv.GetEpoch(), Counter: rv.GetCounter()}
		}
		err := c.routeKey(ctx, p.GetStartKey(), nil, func(d *pb.RangeDescriptor) error {
			return c.rangeCall(ctx, d, true, func(ctx context.Context, rc pb.RangeClient) error {
				r := proto.CloneOf(req)
				r.RangeId = d.GetRangeId()
				_, err := rc.Commit(ctx, r)
				return err
			})
		})
		if err != nil {
			return fmt.Errorf("settling transaction %x at range %d: %w", rec.GetTxnId(), p.GetRangeId(), err)
		}
	}
	return nil
}
