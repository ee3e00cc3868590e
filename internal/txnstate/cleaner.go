package txnstate

import (
	"context"
	"log/slog"
	"time"

	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// Settler drives a committed transaction's outcome to each of its
// participants once more; nil means every one has applied it, so none
// holds a prepared record of it. coordinator.Coordinator implements it.
type Settler interface {
	Settle(ctx context.Context, rec *txnstatepb.Record) error
}

// CleanerConfig tunes a Cleaner. Zero fields take the defaults noted.
type CleanerConfig struct {
	// Grace is how long a record stays after this leader first saw it
	// before the cleaner takes it up (default 1 min): coordinators forget
	// theirs within a second, participants resolve orphans within
	// OrphanAfter, and a record still here after Grace was left behind.
	Grace time.Duration
	// Every is the time between two scans (default Grace/4).
	Every time.Duration
	// LocalEpoch reads a region's current local epoch. An abort record is
	// forgotten only once its region's local epoch has passed the record's
	// abort_bound, so the watermark it raises refuses no commit but those
	// validated before the abort (nil: aborts are never forgotten).
	LocalEpoch func(ctx context.Context, region string) (uint64, error)
}

// Cleaner forgets, on the leaders of the groups a node hosts, the
// records no coordinator forgot (DESIGN.md §14): an aborted record that a
// participant's leader made, once Grace has passed (the watermark then
// refuses its coordinator's late commit); a committed one once Grace has
// passed and the Settler has told every participant the commit. Ages are
// taken on this leader's own clock from when it first saw a record, so a
// new leader starts every record's grace afresh: no clock is compared
// across nodes.
type Cleaner struct {
	srv     *Server
	settler Settler
	cfg     CleanerConfig
	seen    map[uint64]map[string]time.Time // group → txn ID → first seen
}

// NewCleaner returns a cleaner of s's groups that settles through settler.
func NewCleaner(s *Server, settler Settler, cfg CleanerConfig) *Cleaner {
	if cfg.Grace <= 0 {
		cfg.Grace = time.Minute
	}
	if cfg.Every <= 0 {
		cfg.Every = cfg.Grace / 4
	}
	return &Cleaner{srv: s, settler: settler, cfg: cfg, seen: map[uint64]map[string]time.Time{}}
}

// Run scans every Every until ctx ends.
func (c *Cleaner) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, r := range c.srv.hosted() {
			if n, err := c.clean(ctx, r); err != nil && ctx.Err() == nil {
				slog.Debug("cleaning transaction records", "group", r.Group.ID(), "err", err)
			} else if n > 0 {
				slog.Info("forgot left-behind transaction records", "group", r.Group.ID(), "records", n)
			}
		}
	}
}

// clean takes up r's records past their grace, if r leads its group, and
// returns how many it forgot.
func (c *Cleaner) clean(ctx context.Context, r Replica) (int, error) {
	id := r.Group.ID()
	if !r.Group.IsLeader() {
		delete(c.seen, id) // a later leadership starts afresh
		return 0, nil
	}
	seen := c.seen[id]
	if seen == nil {
		seen = map[string]time.Time{}
		c.seen[id] = seen
	}
	now := time.Now()
	present := map[string]bool{}
	var due []*txnstatepb.Record
	err := r.SM.Records(func(rec *txnstatepb.Record) bool {
		k := string(rec.GetTxnId())
		present[k] = true
		first, ok := seen[k]
		if !ok {
			seen[k] = now
		} else if now.Sub(first) >= c.cfg.Grace {
			due = append(due, rec)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	for k := range seen {
		if !present[k] {
			delete(seen, k)
		}
	}
	var forget [][]byte
	for _, rec := range due {
		switch {
		case rec.GetOutcome() == txnstatepb.Outcome_OUTCOME_ABORTED && rec.GetAbortRegion() != "" && c.cfg.LocalEpoch != nil:
			if l, err := c.cfg.LocalEpoch(ctx, rec.GetAbortRegion()); err == nil && l > rec.GetAbortBound() {
				forget = append(forget, rec.GetTxnId())
			}
		case rec.GetOutcome() == txnstatepb.Outcome_OUTCOME_COMMITTED:
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.settler.Settle(sctx, rec)
			cancel()
			if err == nil {
				forget = append(forget, rec.GetTxnId())
			}
		}
	}
	forgotten := len(forget)
	for len(forget) > 0 {
		n := min(len(forget), 1000)
		cmd, err := EncodeForget(forget[:n])
		if err != nil {
			return 0, err
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = propose(pctx, r, id, cmd)
		cancel()
		if err != nil {
			return 0, err
		}
		forget = forget[n:]
	}
	return forgotten, nil
}
