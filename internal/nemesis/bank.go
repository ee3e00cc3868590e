package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/terroir-db/terroir/client"
)

// The bank: accounts spread over the data regions, each funded with
// initialFunds.
const (
	accounts     = 8
	initialFunds = 100
)

// snapshotModes lists every snapshot mode, for workloads that cycle through them.
var snapshotModes = []client.SnapshotMode{client.Strong, client.StrongLocal, client.Linearizable,
	client.Serializable, client.SerializableStale, client.Regional}

// bank moves money between accounts homed in different regions, and audits
// the total in a snapshot of every mode in turn, from every data region: each
// mode is at least serializable, so the total never changes. It keeps the
// latest attempts of transfers, so that an anomaly can name the transaction
// that wrote a bad version (changefeeds' per-version check).
type bank struct {
	cp *campaign

	mu       sync.Mutex
	attempts []transferAttempt // a ring of the latest maxAttempts
	next     int               // where the ring's next attempt goes
}

// transferAttempt is one attempt of a transfer: what it read and so what it
// wrote, from -= amount and to += amount.
type transferAttempt struct {
	from, to, amount int
	readFrom, readTo int
	at               time.Duration // since the campaign began
}

func (a transferAttempt) String() string {
	return fmt.Sprintf("%d from account %d (read %d, wrote %d) to account %d (read %d, wrote %d), at %.3f s",
		a.amount, a.from, a.readFrom, a.readFrom-a.amount, a.to, a.readTo, a.readTo+a.amount, a.at.Seconds())
}

// maxAttempts bounds the attempts the bank keeps: minutes of transfers.
const maxAttempts = 1 << 16

func newBank(cp *campaign) *bank { return &bank{cp: cp} }

// record keeps a transfer attempt that is about to write.
func (b *bank) record(a transferAttempt) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.attempts) < maxAttempts {
		b.attempts = append(b.attempts, a)
		return
	}
	b.attempts[b.next] = a
	b.next = (b.next + 1) % maxAttempts
}

// writers returns the kept attempts that wrote value to account i.
func (b *bank) writers(i, value int) []transferAttempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []transferAttempt
	for _, a := range b.attempts {
		if (a.from == i && a.readFrom-a.amount == value) || (a.to == i && a.readTo+a.amount == value) {
			out = append(out, a)
		}
	}
	return out
}

func (b *bank) account(i int) []byte { return b.cp.key(i, fmt.Sprintf("nemesis-acct-%02d", i)) }

// fund creates the accounts.
func (b *bank) fund(ctx context.Context, db *client.DB) error {
	return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for i := range accounts {
			if err := tx.Put(ctx, b.account(i), []byte(fmt.Sprint(initialFunds))); err != nil {
				return err
			}
		}
		return nil
	})
}

func (b *bank) run(ctx context.Context, dbs []*client.DB, wg *sync.WaitGroup) {
	for i, db := range dbs {
		wg.Add(2)
		go func() { defer wg.Done(); b.transfers(ctx, db, 100+i) }()
		go func() { defer wg.Done(); b.auditor(ctx, db, i) }()
	}
}

// transfers moves money between random accounts until ctx ends.
func (b *bank) transfers(ctx context.Context, db *client.DB, id int) {
	r := rand.New(rand.NewPCG(b.cp.cfg.Seed, uint64(id)))
	for b.cp.waitLoud(ctx) {
		from, to, amount := r.IntN(accounts), r.IntN(accounts), 1+r.IntN(10)
		if from == to {
			continue
		}
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		err := db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
			a, err := readInt(ctx, tx, b.account(from))
			if err != nil {
				return err
			}
			c, err := readInt(ctx, tx, b.account(to))
			if err != nil {
				return err
			}
			b.record(transferAttempt{from: from, to: to, amount: amount, readFrom: a, readTo: c, at: time.Since(b.cp.start)})
			if err := tx.Put(ctx, b.account(from), []byte(fmt.Sprint(a-amount))); err != nil {
				return err
			}
			return tx.Put(ctx, b.account(to), []byte(fmt.Sprint(c+amount)))
		})
		cancel()
		b.cp.countOutcome("bank transfer", err)
	}
}

func readInt(ctx context.Context, tx reader, key []byte) (int, error) {
	v, ok, err := tx.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("nemesis: account %q is missing", key)
	}
	var n int
	_, err = fmt.Sscan(string(v), &n)
	return n, err
}

// reader is what reading a key needs: a transaction or a snapshot.
type reader interface {
	Get(ctx context.Context, key []byte) ([]byte, bool, error)
}

// auditor audits the total every second, cycling through the snapshot modes.
func (b *bank) auditor(ctx context.Context, db *client.DB, region int) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := region; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !b.cp.waitLoud(ctx) {
			return
		}
		b.audit(ctx, db, snapshotModes[n%len(snapshotModes)])
	}
}

func (b *bank) audit(ctx context.Context, db *client.DB, mode client.SnapshotMode) {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	total := 0
	st, err := db.View(octx, mode, func(ctx context.Context, s *client.Snapshot) error {
		total = 0
		for i := range accounts {
			n, err := readInt(ctx, s, b.account(i))
			if err != nil {
				return err
			}
			total += n
		}
		return nil
	})
	if err == nil && st.FollowerReads > 0 {
		b.cp.count(fmt.Sprintf("bank audit (%v), reads served by followers", mode))
	}
	if b.cp.countOutcome(fmt.Sprintf("bank audit (%v)", mode), err) == committed && total != accounts*initialFunds {
		b.cp.anomaly("bank total %d in a %v snapshot, want %d", total, mode, accounts*initialFunds)
	}
}

// final audits once more in a linearizable snapshot.
func (b *bank) final(ctx context.Context, db *client.DB) { b.audit(ctx, db, client.Linearizable) }

// check: audits are checked as they complete.
func (b *bank) check() {}

// dump: the anomalies name the bad totals; there is no history to write.
func (b *bank) dump(string) error { return nil }
