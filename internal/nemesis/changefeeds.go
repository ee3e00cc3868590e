package nemesis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/storage"
)

// changefeeds runs a changefeed over the whole key space for the campaign
// and applies its bank accounts to a copy, as a downstream consumer would
// (DESIGN.md §14). The copy starts from a snapshot's accounts, and the feed
// from that snapshot's epoch. Anomalies: a change out of version-id order
// or at or below an epoch already resolved; at a resolved epoch, an account
// missing or a bank total off; after the faults, the copy differing from a
// snapshot at its resolved epoch + 1; and history the feed protected
// collected under it (ErrSnapshotTooOld). About once a second the copy at a
// resolved epoch r is also compared, sampleDelay later, with the accounts
// read as of r+1 (client.DB.ViewAt): a commit that landed at or below r
// after the feed resolved r — a range closed an epoch a prepared
// transaction could still commit in — shows there, even when a later
// write to the same accounts would have hidden it from the final check.
// Every version of the bank's accounts must also balance on its own: a
// transfer writes two accounts at one version id, the one's loss the
// other's gain (transfers on disjoint accounts may share a version id). A version that does not (half a transfer applied, or a
// transfer that read a value already overwritten: a lost update) is named,
// with the transfers that wrote its values.
type changefeeds struct {
	cp   *campaign
	bank *bank

	cancel   context.CancelFunc
	done     chan struct{}
	samples  chan feedSample
	verified chan struct{}
	sampled  time.Time // the last sample's time; the consumer's alone

	mu       sync.Mutex
	accounts map[string]int // account key → index
	state    map[string]string
	resolved uint64
	rounds   int // resolved epochs since the feed last started
	last     client.Change
	pending  int                                  // changes since the last resolved epoch
	writes   map[storage.VersionID][]accountWrite // the bank's writes since the last resolved epoch
}

// accountWrite is one account's change at a version, as the consumer saw it.
type accountWrite struct{ account, was, is int }

// feedSample is the consumer's accounts at a resolved epoch.
type feedSample struct {
	resolved uint64
	state    map[string]string
	at       time.Time
}

// sampleDelay is how long after a resolved epoch its sample is checked:
// past the orphan bound and a brief stall, so every transaction that was
// prepared then has applied its outcome.
const sampleDelay = 2 * orphanAfter

func newChangefeeds(cp *campaign, b *bank) *changefeeds {
	f := &changefeeds{cp: cp, bank: b, accounts: map[string]int{}, done: make(chan struct{}),
		samples: make(chan feedSample, 16), verified: make(chan struct{})}
	for i := range accounts {
		f.accounts[string(b.account(i))] = i
	}
	return f
}

// run starts the feed. It outlives ctx: final checks it after the faults
// are healed, then stops it.
func (f *changefeeds) run(ctx context.Context, dbs []*client.DB, _ *sync.WaitGroup) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	go f.verify(fctx, dbs[0])
	go func() {
		defer close(f.done)
		db := dbs[0]
		for fctx.Err() == nil {
			if f.state == nil {
				if err := f.start(fctx, db); err != nil {
					f.cp.countOutcome("changefeed start", err)
					sleep(fctx, 100*time.Millisecond)
					continue
				}
			}
			f.mu.Lock()
			from := f.resolved
			f.rounds = 0
			f.mu.Unlock()
			err := db.Changefeed(fctx, client.FeedOptions{From: from, Interval: 50 * time.Millisecond}, f.apply)
			f.mu.Lock()
			protected := f.rounds > 0 // a round passed after the protection was registered
			f.mu.Unlock()
			switch {
			case fctx.Err() != nil:
			case errors.Is(err, client.ErrSnapshotTooOld) && protected:
				f.cp.anomaly("a changefeed resuming after resolved epoch %d lost history it protected: %v", from, err)
				return
			case errors.Is(err, client.ErrSnapshotTooOld):
				// GC passed the starting snapshot before the feed's
				// protection took hold (gc_ttl is seconds here): start
				// again from a new snapshot.
				f.cp.count("changefeed start refused (too old)")
				f.mu.Lock()
				f.state = nil
				f.mu.Unlock()
			default:
				f.cp.countOutcome("changefeed restart", err) // resumes after its resolved epoch
				sleep(fctx, 100*time.Millisecond)
			}
		}
	}()
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// start reads the accounts in a Linearizable snapshot: the copy's first state,
// resolved at the snapshot's epoch - 1.
func (f *changefeeds) start(ctx context.Context, db *client.DB) error {
	sctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	state, at, err := f.accountsAt(sctx, db)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state, f.resolved = state, at-1
	clear(f.writes)
	f.mu.Unlock()
	return nil
}

// accountsAt reads the accounts in a Linearizable snapshot — every epoch
// below its own closed across regions, as the feed's rounds — and returns
// them with the snapshot's epoch.
func (f *changefeeds) accountsAt(ctx context.Context, db *client.DB) (map[string]string, uint64, error) {
	state := map[string]string{}
	st, err := db.View(ctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		return f.readAccounts(ctx, s, state)
	})
	return state, st.Epoch, err
}

// readAccounts reads every account in s into state (cleared first).
func (f *changefeeds) readAccounts(ctx context.Context, s *client.Snapshot, state map[string]string) error {
	clear(state)
	for k := range f.accounts {
		v, ok, err := s.Get(ctx, []byte(k))
		if err != nil {
			return err
		}
		if ok {
			state[k] = string(v)
		}
	}
	return nil
}

// apply is the consumer: it checks each event and applies the accounts'.
func (f *changefeeds) apply(ev client.FeedEvent) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := ev.Change; c != nil {
		if c.Version.Epoch <= f.resolved {
			f.cp.anomaly("changefeed: %q changed at %v, after resolved epoch %d", c.Key, c.Version, f.resolved)
		}
		if f.pending > 0 && c.Version.Less(f.last.Version) {
			f.cp.anomaly("changefeed: %q at %v delivered after %q at %v", c.Key, c.Version, f.last.Key, f.last.Version)
		}
		f.last, f.pending = *c, f.pending+1
		if i, ok := f.accounts[string(c.Key)]; ok {
			f.noteWrite(i, c)
			if c.Tombstone {
				delete(f.state, string(c.Key))
			} else {
				f.state[string(c.Key)] = string(c.Value)
			}
		}
		f.cp.count("changefeed change")
		return nil
	}
	if ev.Resolved <= f.resolved || (f.pending > 0 && f.last.Version.Epoch > ev.Resolved) {
		f.cp.anomaly("changefeed: resolved epoch %d after %d, with a change at %v", ev.Resolved, f.resolved, f.last.Version)
	}
	f.resolved, f.pending, f.rounds = ev.Resolved, 0, f.rounds+1
	f.checkWrites()
	if total, err := f.total(); err != nil || total != accounts*initialFunds {
		f.cp.anomaly("changefeed: at resolved epoch %d the consumer's bank total is %d (%v), want %d", ev.Resolved, total, err, accounts*initialFunds)
	}
	if now := time.Now(); now.Sub(f.sampled) >= time.Second {
		f.sampled = now
		s := feedSample{resolved: ev.Resolved, state: make(map[string]string, len(f.accounts)), at: now}
		for k := range f.accounts {
			s.state[k] = f.state[k]
		}
		select {
		case f.samples <- s:
		default: // the verifier is behind: skip this one
		}
	}
	f.cp.count("changefeed resolved")
	return nil
}

// verify checks the samples, each sampleDelay after it was taken, until
// ctx ends: the accounts read as of resolved+1 must equal the copy's.
func (f *changefeeds) verify(ctx context.Context, db *client.DB) {
	defer close(f.verified)
	for {
		var s feedSample
		select {
		case <-ctx.Done():
			return
		case s = <-f.samples:
		}
		if !sleep(ctx, time.Until(s.at.Add(sampleDelay))) || !f.cp.waitLoud(ctx) {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		got := map[string]string{}
		_, err := db.ViewAt(rctx, s.resolved+1, func(ctx context.Context, snap *client.Snapshot) error {
			return f.readAccounts(ctx, snap, got)
		})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, client.ErrSnapshotTooOld):
			f.cp.count("changefeed sample collected before its check")
		case err != nil:
			f.cp.countOutcome("changefeed sample read", err)
		default:
			f.cp.count("changefeed sample checked")
			for k, i := range f.accounts {
				if got[k] != s.state[k] {
					f.cp.anomaly("changefeed: account %d is %q in the consumer at resolved epoch %d, %q read as of epoch %d %v later",
						i, s.state[k], s.resolved, got[k], s.resolved+1, sampleDelay)
				}
			}
		}
	}
}

// noteWrite keeps account i's change c, with f.mu held, when both its old
// and new values are amounts (not the first funding, nor a deletion).
func (f *changefeeds) noteWrite(i int, c *client.Change) {
	var was, is int
	if _, err := fmt.Sscan(f.state[string(c.Key)], &was); err != nil || c.Tombstone {
		return
	}
	if _, err := fmt.Sscan(string(c.Value), &is); err != nil {
		return
	}
	if f.writes == nil {
		f.writes = map[storage.VersionID][]accountWrite{}
	}
	for _, w := range f.writes[c.Version] {
		if w.account == i {
			return // again, from a feed resumed after the last resolved epoch
		}
	}
	f.writes[c.Version] = append(f.writes[c.Version], accountWrite{account: i, was: was, is: is})
}

// checkWrites checks, with f.mu held at a resolved epoch, that each version
// of the accounts since the last one balances: the accounts it wrote lost
// what they gained.
func (f *changefeeds) checkWrites() {
	for v, ws := range f.writes {
		sum := 0
		for _, w := range ws {
			sum += w.is - w.was
		}
		if sum == 0 { // one transfer, or more: disjoint transactions may share a version id
			continue
		}
		desc := ""
		for _, w := range ws {
			desc += fmt.Sprintf("; account %d %d → %d, written by [", w.account, w.was, w.is)
			for n, a := range f.bank.writers(w.account, w.is) {
				if n > 0 {
					desc += " | "
				}
				desc += a.String()
			}
			desc += "]"
		}
		f.cp.anomaly("changefeed: the bank's write at version %v does not balance (%d accounts, sum %+d)%s", v, len(ws), sum, desc)
	}
	clear(f.writes)
}

// total sums the copy's accounts, with f.mu held.
func (f *changefeeds) total() (int, error) {
	sum := 0
	for k, i := range f.accounts {
		v, ok := f.state[k]
		if !ok {
			return 0, fmt.Errorf("account %d missing", i)
		}
		var n int
		if _, err := fmt.Sscan(v, &n); err != nil {
			return 0, fmt.Errorf("account %d holds %q", i, v)
		}
		sum += n
	}
	return sum, nil
}

// final waits for the feed to resolve past a snapshot taken now,
// when nothing writes, and compares the copy with it; then stops the feed.
func (f *changefeeds) final(ctx context.Context, db *client.DB) {
	defer func() {
		f.cancel()
		<-f.done
		<-f.verified
	}()
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var want map[string]string
	var at uint64
	for fctx.Err() == nil {
		var err error
		if want, at, err = f.accountsAt(fctx, db); err == nil {
			break
		}
	}
	if at == 0 {
		f.cp.anomaly("changefeed: no snapshot of the accounts after the faults were healed")
		return
	}
	for fctx.Err() == nil {
		f.mu.Lock()
		r, state := f.resolved, f.state
		if r+1 >= at && state != nil {
			for k, i := range f.accounts {
				if state[k] != want[k] {
					f.cp.anomaly("changefeed: account %d is %q in the consumer at resolved epoch %d, %q in a snapshot at %d", i, state[k], r, want[k], at)
				}
			}
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		sleep(fctx, 20*time.Millisecond)
	}
	f.cp.anomaly("changefeed: never resolved epoch %d after the faults were healed", at-1)
}

// check: events are checked as they arrive, and the copy in final.
func (f *changefeeds) check() {}

func (f *changefeeds) dump(string) error { return nil }
