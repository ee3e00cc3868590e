package client_test

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestACommitReadsItsEpochsAfterItsLastLock: an interactive write's
// one-phase commit uses the epochs its range leader read ahead at the
// transaction's Lock (issue 17: the commit waits no round of epoch reads),
// but only while no later Lock of the transaction followed: a transaction
// that locks again after the epochs moved commits at an epoch no older than
// one read before that later lock (invariant 4: every lock before any
// epoch).
func TestACommitReadsItsEpochsAfterItsLastLock(t *testing.T) {
	c, db := startCluster(t, localcluster.Options{})
	// A second client is a session of its own, and writes another range:
	// its versions raise neither db's session epoch nor range 10's highest.
	probe, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	readAheads := func() (n float64) {
		c.EachMetricFamily(func(mf *dto.MetricFamily) {
			if mf.GetName() == "terroir_commit_epochs_read_ahead_total" {
				for _, m := range mf.GetMetric() {
					n += m.GetCounter().GetValue()
				}
			}
		})
		return n
	}
	epochNow := func() uint64 { // the epoch a commit reads now (regional-only: the local epoch)
		t.Helper()
		var v client.Version
		retry(t, ctx, "probe Put", func() (err error) {
			v, err = probe.Put(ctx, []byte("zebra"), []byte("striped"))
			return err
		})
		return v.Epoch
	}

	before := readAheads()
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return tx.Put(ctx, []byte("apple"), []byte("red"))
	}); err != nil {
		t.Fatal(err)
	}
	if got := readAheads() - before; got < 1 {
		t.Fatalf("a Put then Commit: %v commits used epochs read ahead, want 1", got)
	}

	tx := db.Begin()
	if err := tx.Put(ctx, []byte("apricot"), []byte("orange")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the read ahead at the Put has answered
	first := epochNow()
	later := first
	for later < first+2 {
		if ctx.Err() != nil {
			t.Fatalf("the epoch stayed at %d", later)
		}
		time.Sleep(20 * time.Millisecond)
		later = epochNow()
	}
	before = readAheads()
	if err := tx.Put(ctx, []byte("avocado"), []byte("green")); err != nil {
		t.Fatal(err)
	}
	v, err := tx.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Epoch < later {
		t.Fatalf("committed at epoch %d, below %d read before its last lock: it used epochs read ahead of that lock", v.Epoch, later)
	}
	if got := readAheads() - before; got != 0 {
		t.Fatalf("a commit whose transaction locked again after its read ahead: %v commits used epochs read ahead, want 0", got)
	}
}
