package txnstate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/txnstate"
	pb "github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func txnID(i int) []byte {
	id := make([]byte, txnstate.TxnIDLen)
	copy(id, fmt.Sprintf("txn-%012d", i))
	return id
}

func decision(i int, o pb.Outcome) *pb.Record {
	r := &pb.Record{TxnId: txnID(i), Outcome: o}
	if o == pb.Outcome_OUTCOME_COMMITTED {
		r.Version = &pb.VersionID{Epoch: 7, Counter: uint32(i)}
		r.Participants = []*pb.Participant{{RangeId: 10, Writes: true}}
	}
	return r
}

func cmd(t *testing.T, r *pb.Record) []byte {
	b, err := txnstate.EncodeDecide(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newSM(t *testing.T, e *storage.Engine, group uint64) *txnstate.StateMachine {
	t.Helper()
	sm, err := txnstate.NewStateMachine(e, group)
	if err != nil {
		t.Fatal(err)
	}
	return sm
}

func TestFirstDecisionWins(t *testing.T) {
	e, err := storage.Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	sm := newSM(t, e, 5)
	b := e.NewIndexedBatch()
	// Two decisions for one transaction in one batch: the first wins.
	won := sm.Apply(b, 1, cmd(t, decision(1, pb.Outcome_OUTCOME_COMMITTED))).(*pb.Record)
	again := sm.Apply(b, 2, cmd(t, decision(1, pb.Outcome_OUTCOME_ABORTED))).(*pb.Record)
	if won.GetOutcome() != pb.Outcome_OUTCOME_COMMITTED || again.GetOutcome() != pb.Outcome_OUTCOME_COMMITTED {
		t.Fatalf("outcomes %v then %v; want committed twice", won.GetOutcome(), again.GetOutcome())
	}
	if err, ok := sm.Apply(b, 3, cmd(t, &pb.Record{TxnId: txnID(2)})).(error); !ok || !errors.Is(err, txnstate.ErrBadRecord) {
		t.Fatalf("an UNKNOWN decision applied: %v", err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	got, err := sm.Get(txnID(1))
	if err != nil || got.GetOutcome() != pb.Outcome_OUTCOME_COMMITTED || got.GetVersion().GetCounter() != 1 {
		t.Fatalf("Get = %v, %v", got, err)
	}
	if got, _ := sm.Get(txnID(9)); got.GetOutcome() != pb.Outcome_OUTCOME_UNKNOWN {
		t.Fatalf("undecided transaction has outcome %v", got.GetOutcome())
	}

	// A snapshot restores into another group's state machine.
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	other := newSM(t, e, 6)
	b = e.NewIndexedBatch()
	if err := other.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := other.Get(txnID(1)); got.GetOutcome() != pb.Outcome_OUTCOME_COMMITTED {
		t.Fatal("snapshot lost a record")
	}
	if err := other.Restore(e.NewIndexedBatch(), snap[:len(snap)-1]); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("Restore of a truncated snapshot = %v, want ErrCorrupt", err)
	}
}

// TestForgottenAbortRefusesALateCommit (DESIGN.md §14): forgetting a
// commit record leaves nothing; forgetting an abort record a participant
// made raises its region's watermark to the record's bound, and from then
// on a commit whose l_R in that region is at or below it is answered
// ABORTED and not stored (its abort record may be the one forgotten),
// while a commit validated at a later local epoch is recorded. The
// watermark survives a restart and a snapshot.
func TestForgottenAbortRefusesALateCommit(t *testing.T) {
	dir := t.TempDir()
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	sm := newSM(t, e, 5)
	apply := func(c []byte) any {
		t.Helper()
		b := e.NewIndexedBatch()
		res := sm.Apply(b, 1, c)
		if err := e.Commit(b, true); err != nil {
			t.Fatal(err)
		}
		return res
	}
	forget := func(ids ...[]byte) int {
		t.Helper()
		c, err := txnstate.EncodeForget(ids)
		if err != nil {
			t.Fatal(err)
		}
		return apply(c).(int)
	}
	committed := decision(1, pb.Outcome_OUTCOME_COMMITTED)
	apply(cmd(t, committed))
	aborted := &pb.Record{TxnId: txnID(2), Outcome: pb.Outcome_OUTCOME_ABORTED, AbortRegion: "us-east1", AbortBound: 150}
	apply(cmd(t, aborted))
	if n := forget(txnID(1), txnID(2), txnID(3)); n != 2 {
		t.Fatalf("forgot %d records, want 2 (an unknown ID is ignored)", n)
	}
	for _, i := range []int{1, 2} {
		if got, _ := sm.Get(txnID(i)); got.GetOutcome() != pb.Outcome_OUTCOME_UNKNOWN {
			t.Fatalf("txn %d after Forget: %v", i, got.GetOutcome())
		}
	}
	if w := sm.Watermarks()["us-east1"]; w != 150 {
		t.Fatalf("watermark %d after forgetting an abort bounded at 150", w)
	}
	late := decision(2, pb.Outcome_OUTCOME_COMMITTED)
	late.LocalEpochs = map[string]uint64{"us-east1": 150, "us-west1": 900}
	if got := apply(cmd(t, late)).(*pb.Record); got.GetOutcome() != pb.Outcome_OUTCOME_ABORTED {
		t.Fatalf("a commit validated at l_R 150 after the abort was forgotten: %v, want ABORTED", got.GetOutcome())
	}
	if got, _ := sm.Get(txnID(2)); got.GetOutcome() != pb.Outcome_OUTCOME_UNKNOWN {
		t.Fatalf("a refused commit was stored: %v", got.GetOutcome())
	}
	fresh := decision(4, pb.Outcome_OUTCOME_COMMITTED)
	fresh.LocalEpochs = map[string]uint64{"us-east1": 151}
	if got := apply(cmd(t, fresh)).(*pb.Record); got.GetOutcome() != pb.Outcome_OUTCOME_COMMITTED {
		t.Fatalf("a commit validated at l_R 151: %v, want COMMITTED", got.GetOutcome())
	}
	// A lower bound never lowers the watermark.
	apply(cmd(t, &pb.Record{TxnId: txnID(5), Outcome: pb.Outcome_OUTCOME_ABORTED, AbortRegion: "us-east1", AbortBound: 20}))
	forget(txnID(5))
	snap, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if e, err = storage.Open(dir, 1); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if w := newSM(t, e, 5).Watermarks()["us-east1"]; w != 150 {
		t.Fatalf("watermark %d after a restart, want 150", w)
	}
	other := newSM(t, e, 6)
	b := e.NewIndexedBatch()
	if err := other.Restore(b, snap); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if w := other.Watermarks()["us-east1"]; w != 150 {
		t.Fatalf("watermark %d after a snapshot, want 150", w)
	}
	if got, _ := other.Get(txnID(4)); got.GetOutcome() != pb.Outcome_OUTCOME_COMMITTED {
		t.Fatalf("the snapshot lost a record: %v", got.GetOutcome())
	}
}

// TestExactlyOneOutcomeUnderLeaderKill races commit against abort for many
// transactions from concurrent clients while the group's leader is killed.
func TestExactlyOneOutcomeUnderLeaderKill(t *testing.T) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	group := c.Topology.GroupsOfKind(topology.KindTxnState, "us-east1")[0].ID
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const txns, racers = 40, 6
	results := make([][]pb.Outcome, txns)
	var mu sync.Mutex
	var wg sync.WaitGroup
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		time.Sleep(100 * time.Millisecond)
		for c.Leader(group) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		if err := c.StopNode(c.Leader(group)); err != nil {
			t.Error(err)
		}
	}()
	for r := 0; r < racers; r++ {
		cl, err := c.TxnStateClient("us-east1")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := 0; i < txns; i++ {
				o := pb.Outcome_OUTCOME_COMMITTED
				if (i+r)%2 == 0 {
					o = pb.Outcome_OUTCOME_ABORTED
				}
				for {
					rec, err := cl.Decide(ctx, decision(i, o))
					if err == nil {
						mu.Lock()
						results[i] = append(results[i], rec.GetOutcome())
						mu.Unlock()
						break
					}
					if ctx.Err() != nil {
						t.Errorf("txn %d: %v", i, err)
						return
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
		}(r)
	}
	wg.Wait()
	<-killed
	reader, err := c.TxnStateClient("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	for i, outs := range results {
		if len(outs) != racers {
			t.Fatalf("txn %d: %d answers, want %d", i, len(outs), racers)
		}
		for _, o := range outs {
			if o != outs[0] {
				t.Fatalf("txn %d: decisions disagree: %v", i, outs)
			}
		}
		rec, err := reader.Get(ctx, txnID(i))
		if err != nil || rec.GetOutcome() != outs[0] {
			t.Fatalf("txn %d: Get = %v, %v; decided %v", i, rec.GetOutcome(), err, outs[0])
		}
	}
}
