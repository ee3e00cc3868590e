package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

const (
	accounts       = 20
	initialBalance = 1000
)

// Accounts alternate between the two ranges ("a…" < "m" ≤ "x…"), so most
// transfers are two-phase.
func account(i int) []byte {
	if i%2 == 0 {
		return []byte(fmt.Sprintf("acct-%02d", i))
	}
	return []byte(fmt.Sprintf("x-acct-%02d", i))
}

func receipt(id uint64) []byte { return []byte(fmt.Sprintf("x-receipt-%016x", id)) }

func enc(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }
func dec(b []byte) int64 { return int64(binary.BigEndian.Uint64(b)) }

// fund opens every account with initialBalance.
func fund(t *testing.T, ctx context.Context, db *client.DB) {
	t.Helper()
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for i := 0; i < accounts; i++ {
			if err := tx.Put(ctx, account(i), enc(initialBalance)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// transfer moves amount from account `from` to account `to` in tx.
func transfer(ctx context.Context, tx *client.Txn, from, to int, amount int64) error {
	a, _, err := tx.Get(ctx, account(from))
	if err != nil {
		return err
	}
	b, _, err := tx.Get(ctx, account(to))
	if err != nil {
		return err
	}
	if err := tx.Put(ctx, account(from), enc(dec(a)-amount)); err != nil {
		return err
	}
	return tx.Put(ctx, account(to), enc(dec(b)+amount))
}

// total reads every account in one locking transaction.
func total(ctx context.Context, db *client.DB) (int64, error) {
	var sum int64
	err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		sum = 0
		for i := 0; i < accounts; i++ {
			v, ok, err := tx.Get(ctx, account(i))
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("account %d missing", i)
			}
			sum += dec(v)
		}
		return nil
	})
	return sum, err
}

// TestBankUnderLeaderKillAndRestart runs random transfers from 8 clients while a
// range leader is killed and a node restarted; every locking read of all
// accounts sees the initial total, and every acknowledged transfer survives a
// restart of the whole cluster.
func TestBankUnderLeaderKillAndRestart(t *testing.T) {
	top, err := topology.Load("../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := localcluster.Start(top, localcluster.Options{DataDir: dir, Crashable: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	fund(t, ctx, db)

	var (
		mu        sync.Mutex
		acked     []uint64
		unknown   int
		totals    int
		transfers = make(chan struct{})
	)
	work, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		cdb, err := c.Client("us-east1")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 42))
			for n := 0; work.Err() == nil; n++ {
				if w == 0 { // one client checks the total, continuously
					sum, err := total(work, cdb)
					if err == nil {
						if sum != accounts*initialBalance {
							t.Errorf("total %d, want %d", sum, accounts*initialBalance)
						}
						mu.Lock()
						totals++
						mu.Unlock()
					}
					continue
				}
				from, to := r.IntN(accounts), r.IntN(accounts)
				if from == to {
					continue
				}
				amount := int64(r.IntN(50))
				id := r.Uint64()
				err := cdb.Update(work, func(ctx context.Context, tx *client.Txn) error {
					if err := transfer(ctx, tx, from, to, amount); err != nil {
						return err
					}
					return tx.Put(ctx, receipt(id), []byte("ok"))
				})
				mu.Lock()
				switch {
				case err == nil:
					acked = append(acked, id)
				case errors.Is(err, client.ErrCommitUnknown):
					unknown++
				}
				mu.Unlock()
				select {
				case transfers <- struct{}{}:
				default:
				}
			}
		}(w)
	}
	waitTransfers := func(n int) {
		for i := 0; i < n; i++ {
			select {
			case <-transfers:
			case <-ctx.Done():
				t.Fatalf("transfers stalled")
			}
		}
	}
	waitTransfers(30)
	leader := c.Leader(10)
	if leader == 0 {
		t.Fatal("range 10 has no leader")
	}
	if err := c.KillNode(leader); err != nil {
		t.Fatal(err)
	}
	waitTransfers(30)
	if err := c.RestartNode(leader); err != nil {
		t.Fatal(err)
	}
	waitTransfers(30)
	other := leader%3 + 1
	if err := c.KillNode(other); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartNode(other); err != nil {
		t.Fatal(err)
	}
	waitTransfers(30)
	stopWork()
	wg.Wait()
	sum, err := total(ctx, db)
	if err != nil || sum != accounts*initialBalance {
		t.Fatalf("final total %d (%v), want %d", sum, err, accounts*initialBalance)
	}
	mu.Lock()
	t.Logf("%d transfers acknowledged, %d with unknown outcome, %d totals checked", len(acked), unknown, totals)
	mu.Unlock()

	// Kill every node at once (a power loss), and restart the whole cluster
	// from its data directories.
	for _, id := range c.NodeIDs() {
		if err := c.KillNode(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	c2, err := localcluster.Start(top, localcluster.Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	db2, err := c2.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	if sum, err := total(ctx, db2); err != nil || sum != accounts*initialBalance {
		t.Fatalf("total after a full restart %d (%v)", sum, err)
	}
	err = db2.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for _, id := range acked {
			if _, ok, err := tx.Get(ctx, receipt(id)); err != nil {
				return err
			} else if !ok {
				return fmt.Errorf("acknowledged transfer %x lost", id)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
