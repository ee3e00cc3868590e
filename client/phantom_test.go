package client_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestNoPhantoms races a scan that records what it saw against an insert into
// the scanned range that reads that record. Serializable outcomes: the scan saw
// the insert (insert first, so the insert read an older record), or it did not
// (scan first, so the insert read this scan's record). A scan that missed the
// insert while the insert missed the scan's record is a phantom.
func TestNoPhantoms(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 90*time.Second)
	summary := []byte("z-summary") // in the other range: the scan commits in two phases
	orders := map[bool]int{}
	defer func() { t.Logf("scan saw the insert in %d rounds, missed it in %d", orders[true], orders[false]) }()
	for round := 0; round < 25; round++ {
		prefix := fmt.Sprintf("p%02d-", round)
		lo, hi := []byte(prefix), []byte(prefix+"~")
		inserted := []byte(prefix + "new")
		var (
			scanSaw   bool
			scanRound int
			readRound = -1
			wg        sync.WaitGroup
			errs      = make(chan error, 2)
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
				kvs, err := tx.Scan(ctx, lo, hi, 0)
				if err != nil {
					return err
				}
				scanSaw = false
				for _, kv := range kvs {
					scanSaw = scanSaw || string(kv.Key) == string(inserted)
				}
				scanRound = round
				return tx.Put(ctx, summary, []byte(strconv.Itoa(round)))
			})
		}()
		go func() {
			defer wg.Done()
			errs <- db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
				v, ok, err := tx.Get(ctx, summary)
				if err != nil {
					return err
				}
				readRound = -1
				if ok {
					readRound, _ = strconv.Atoi(string(v))
				}
				return tx.Put(ctx, inserted, []byte("x"))
			})
		}()
		wg.Wait()
		for i := 0; i < 2; i++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		orders[scanSaw]++
		switch {
		case scanSaw && readRound == scanRound:
			t.Fatalf("round %d: the scan saw the insert and the insert saw the scan's record: a cycle", round)
		case !scanSaw && readRound != scanRound:
			t.Fatalf("round %d: phantom: the scan missed the insert, and the insert read record %d, not the scan's", round, readRound)
		}
	}
}
