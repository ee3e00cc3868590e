package nemesis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/directory"
)

// protectionTTL is how long a long snapshot's protection outlives its
// last renewal: longer than any fault the campaign injects.
const protectionTTL = 30 * time.Second

// longSnapshots holds Linearizable snapshots of the bank open for several
// gc_ttls while transfers rewrite every account and range leaders collect
// old versions, and rereads them (DESIGN.md §14). Every reread of a
// snapshot must return exactly what its first read did, with the bank's
// total. Half the snapshots are protected (a registration at their epoch,
// renewed as a backup's is): a protected snapshot refused with
// ErrSnapshotTooOld is an anomaly; an unprotected one may be refused,
// never answered differently.
type longSnapshots struct {
	cp   *campaign
	bank *bank
}

func newLongSnapshots(cp *campaign, b *bank) *longSnapshots { return &longSnapshots{cp: cp, bank: b} }

func (l *longSnapshots) run(ctx context.Context, dbs []*client.DB, wg *sync.WaitGroup) {
	if l.cp.cfg.Topology.GCTTL <= 0 {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; l.cp.waitLoud(ctx); n++ {
			l.hold(ctx, dbs[n%len(dbs)], l.cp.regions[n%len(dbs)], n%2 == 0)
		}
	}()
}

// holdFor is how long a long snapshot stays open: three gc_ttls, between
// 5 s and 30 s.
func (l *longSnapshots) holdFor() time.Duration {
	return min(max(3*l.cp.cfg.Topology.GCTTL, 5*time.Second), 30*time.Second)
}

// hold opens one long snapshot from region, protected or not, and rereads
// it until holdFor passed or ctx ends.
func (l *longSnapshots) hold(ctx context.Context, db *client.DB, region string, protect bool) {
	what := "long snapshot"
	if protect {
		what = "protected long snapshot"
	}
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	s, err := db.BeginSnapshot(octx, client.Linearizable)
	if err != nil {
		l.cp.countOutcome(what, err)
		return
	}
	began := time.Now()
	first, err := l.read(octx, s)
	if err != nil {
		l.cp.countOutcome(what, err)
		return
	}
	protected := false
	if protect {
		dirs := directory.NewDirectories(l.cp.cfg.Topology, l.cp.c.Dialer(region))
		h, err := dirs.Protect(octx, fmt.Sprintf("nemesis-%d", began.UnixNano()), "nemesis long snapshot", s.Stats().Epoch, protectionTTL)
		if err != nil {
			l.cp.countOutcome(what+" protect", err)
		} else {
			defer func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
				defer cancel()
				_ = h.Release(rctx)
			}()
			// Registered before GC could reach the epoch: from here on a
			// refusal is the protection failing.
			protected = time.Since(began) < l.cp.cfg.Topology.GCTTL/2
		}
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for end := began.Add(l.holdFor()); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if l.cp.quiet() {
			continue // no reread in a quiet spell
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		again, err := l.read(rctx, s)
		cancel()
		switch {
		case errors.Is(err, client.ErrSnapshotTooOld) && protected:
			l.cp.anomaly("a protected snapshot at epoch %d was refused after %v: %v", s.Stats().Epoch, time.Since(began).Round(time.Millisecond), err)
			return
		case errors.Is(err, client.ErrSnapshotTooOld):
			l.cp.count(what + " refused (too old)")
			return
		case err != nil:
			l.cp.countOutcome(what+" reread", err)
		case !slices.Equal(again, first):
			l.cp.anomaly("a snapshot at epoch %d read %v, then %v after %v", s.Stats().Epoch, first, again, time.Since(began).Round(time.Millisecond))
			return
		default:
			l.cp.count(what + " reread committed")
		}
	}
}

// read returns every account's balance in s; their total must be the
// bank's.
func (l *longSnapshots) read(ctx context.Context, s *client.Snapshot) ([]int, error) {
	out := make([]int, accounts)
	total := 0
	for i := range accounts {
		v, ok, err := s.Get(ctx, l.bank.account(i))
		if err != nil {
			return nil, err
		}
		if !ok { // accounts are never deleted: GC took a version the snapshot reads
			l.cp.anomaly("account %d missing in a long snapshot at epoch %d", i, s.Stats().Epoch)
			return nil, fmt.Errorf("nemesis: account %d is missing", i)
		}
		if _, err := fmt.Sscan(string(v), &out[i]); err != nil {
			l.cp.anomaly("account %d holds %q in a long snapshot at epoch %d", i, v, s.Stats().Epoch)
			return nil, err
		}
		total += out[i]
	}
	if total != accounts*initialFunds {
		l.cp.anomaly("bank total %d in a long snapshot at epoch %d, want %d", total, s.Stats().Epoch, accounts*initialFunds)
	}
	return out, nil
}

func (l *longSnapshots) final(context.Context, *client.DB) {}

// check: rereads are checked as they complete.
func (l *longSnapshots) check() {}

func (l *longSnapshots) dump(string) error { return nil }
