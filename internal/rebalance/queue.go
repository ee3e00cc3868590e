package rebalance

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/transport"
)

// Cluster is what the queue reads and changes: the region's registry,
// ranges and leases, and the operations it runs at the ranges'
// leaseholders.
type Cluster interface {
	// Leads reports whether this node runs the region's queue now (it
	// leads the region's directory).
	Leads() bool
	// View reads the region's registry, ranges and leases.
	View(ctx context.Context) (View, error)
	// MoveReplica, TransferLease: at the range's leaseholder, with the
	// range's start key.
	// A transfer ifIdle is refused while the range holds locks.
	MoveReplica(ctx context.Context, key []byte, from, to uint64) error
	TransferLease(ctx context.Context, key []byte, to uint64, ifIdle bool) error
	// MoveGroupReplica: at the non-range group's leader.
	MoveGroupReplica(ctx context.Context, group, from, to uint64) error
	// MarkGone marks a drained node gone in the registry.
	MarkGone(ctx context.Context, id uint64) error
}

// QueueConfig sets the queue's pace.
type QueueConfig struct {
	Config
	// Interval: how often it plans (default 2 s).
	Interval time.Duration
	// ActionTimeout bounds one step (default 30 s).
	ActionTimeout time.Duration
	// LeaseSettle: lease counts must stay uneven this long before the
	// queue evens them (default 30 s), so leases that a merge gathers on
	// one node (DESIGN.md §11) are not pulled apart before it runs. For as
	// long again it waits for a moment a range holds no locks; after that
	// it transfers anyway (transactions holding only unreplicated locks
	// there abort and retry), or a range always under load would never
	// move its lease.
	LeaseSettle time.Duration
}

// idleTransferTimeout bounds a balancing lease transfer that waits for
// the range to hold no locks.
const idleTransferTimeout = 2 * time.Second

// Queue runs plans for one region until its context ends.
type Queue struct {
	c   Cluster
	cfg QueueConfig

	mu          sync.Mutex
	stats       Stats
	unevenSince time.Time // when plans began to even lease counts out (zero: they do not)
}

// Stats counts what a queue did.
type Stats struct {
	Moves, Transfers, Gone, Failed int
}

// NewQueue returns a queue over c.
func NewQueue(c Cluster, cfg QueueConfig) *Queue {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.ActionTimeout <= 0 {
		cfg.ActionTimeout = 30 * time.Second
	}
	if cfg.MaxMoves <= 0 {
		cfg.MaxMoves = 2
	}
	if cfg.LeaseSettle <= 0 {
		cfg.LeaseSettle = 30 * time.Second
	}
	return &Queue{c: c, cfg: cfg}
}

// Run plans every Interval while this node leads the region's directory,
// and runs each plan's steps (at most MaxMoves replica moves, so as many
// snapshots, at once), until ctx ends.
func (q *Queue) Run(ctx context.Context) {
	for transport.SleepCtx(ctx, q.cfg.Interval) {
		if !q.c.Leads() {
			continue
		}
		q.Once(ctx)
	}
}

// Once plans and runs one round; it returns the steps it ran.
func (q *Queue) Once(ctx context.Context) []Action {
	vctx, cancel := context.WithTimeout(ctx, q.cfg.ActionTimeout)
	v, err := q.c.View(vctx)
	cancel()
	if err != nil {
		return nil
	}
	plan := q.settle(Plan(v, q.cfg.Config), time.Now())
	var wg sync.WaitGroup
	for _, a := range plan {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, q.cfg.ActionTimeout)
			defer cancel()
			var err error
			switch a.Kind {
			case Move:
				err = q.c.MoveReplica(actx, a.Range.GetStartKey(), a.From, a.To)
			case Transfer:
				if a.Balance {
					var cancel context.CancelFunc
					actx, cancel = context.WithTimeout(actx, idleTransferTimeout)
					defer cancel()
				}
				err = q.c.TransferLease(actx, a.Range.GetStartKey(), a.To, a.Balance && !q.insist(time.Now()))
			case Gone:
				err = q.c.MarkGone(actx, a.From)
			case MoveGroup:
				err = q.c.MoveGroupReplica(actx, a.Group, a.From, a.To)
			}
			if err != nil {
				slog.Info("rebalance: step failed", "kind", a.Kind, "range", a.Range.GetRangeId(), "group", a.Group, "from", a.From, "to", a.To, "why", a.Why, "err", err)
				return
			}
			slog.Info("rebalance: step done", "kind", a.Kind, "range", a.Range.GetRangeId(), "group", a.Group, "from", a.From, "to", a.To, "why", a.Why)
		}()
	}
	wg.Wait()
	return plan
}

// insist reports whether lease counts have been uneven so long (twice
// LeaseSettle) that a balancing transfer no longer waits for an idle range.
func (q *Queue) insist(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.unevenSince.IsZero() && now.Sub(q.unevenSince) >= 2*q.cfg.LeaseSettle
}

// settle drops plan's balancing lease transfers until lease counts have
// been uneven for LeaseSettle.
func (q *Queue) settle(plan []Action, now time.Time) []Action {
	uneven := slices.ContainsFunc(plan, func(a Action) bool { return a.Kind == Transfer && a.Balance })
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case !uneven:
		q.unevenSince = time.Time{}
		return plan
	case q.unevenSince.IsZero():
		q.unevenSince = now
	}
	if now.Sub(q.unevenSince) >= q.cfg.LeaseSettle {
		return plan
	}
	return slices.DeleteFunc(plan, func(a Action) bool { return a.Kind == Transfer && a.Balance })
}
