package rebalance

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/raftgroup"
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
	// MoveNonVoter moves the non-voting replica of the range holding key
	// (homed in another region) from node from to node to: to is added,
	// then from removed (to 0: only removed).
	MoveNonVoter(ctx context.Context, key []byte, from, to uint64) error
	// Split splits the range holding key at key; AddNonVoter adds a
	// non-voting replica of it on node to (DESIGN.md §13).
	Split(ctx context.Context, key []byte) error
	AddNonVoter(ctx context.Context, key []byte, to uint64) error
	// Rehome moves the home of the range holding key to region.
	Rehome(ctx context.Context, key []byte, region string) error
}

// QueueConfig sets the queue's pace.
type QueueConfig struct {
	Config
	// Interval: how often it plans (default 2 s).
	Interval time.Duration
	// ActionTimeout bounds one step (default 30 s); a step that streams a
	// range's snapshot gets more, by the range's size (stepTimeout).
	ActionTimeout time.Duration
	// SnapshotRate is the bytes per second a node streams snapshots at,
	// all at once (raftgroup.Config.SnapshotRate; default
	// raftgroup.DefaultSnapshotRate).
	SnapshotRate float64
	// AutoRehomeAfter: an automatic rehome (Config.AutoRehome) is carried
	// out once it has been planned in every round for this long (topology
	// auto_rehome_after).
	AutoRehomeAfter time.Duration
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
	unevenSince time.Time             // when plans began to even lease counts out (zero: they do not)
	autoRehomes map[uint64]autoRehome // by range ID: automatic rehomes planned in every round since
	// flights: the ranges, groups and nodes of steps under way (zero
	// time) or ended less than an Interval ago (until then: the directory
	// may not show their outcome yet, and a plan must not redo them).
	flights map[flight]time.Time
	moves   int // steps under way that count against MaxMoves
	steps   sync.WaitGroup
	// running: the steps under way, by a number start gives each, with
	// when each began (Stats.Running).
	running map[uint64]runningStep
	stepSeq uint64
}

// runningStep is a step under way and when it began.
type runningStep struct {
	a     Action
	began time.Time
}

// flight names what a step changes: a range (moves and transfers), a
// group, or a node (marked gone).
type flight struct {
	kind Kind // Move for ranges, MoveGroup, Gone
	id   uint64
}

func flightOf(a Action) flight {
	switch a.Kind {
	case Move, Transfer, MoveNonVoter, Split, AddNonVoter, Rehome:
		return flight{Move, a.Range.GetRangeId()}
	case MoveGroup:
		return flight{MoveGroup, a.Group}
	}
	return flight{Gone, a.From}
}

// Stats counts a queue's steps since it started, by Kind.
type Stats struct {
	Done, Failed [numKinds]int
	// InFlight: steps started and not yet ended.
	InFlight int
	// LastFailed describes the last step that failed, with its error and
	// when ("" if none has): what an operator, or a campaign whose drain
	// stalls, reads first.
	LastFailed string
	// Running describes each step under way and when it began, oldest
	// first: a step that waits out its timeout shows here, not yet in
	// LastFailed.
	Running []string
}

// NewQueue returns a queue over c.
func NewQueue(c Cluster, cfg QueueConfig) *Queue {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.ActionTimeout <= 0 {
		cfg.ActionTimeout = 30 * time.Second
	}
	if cfg.SnapshotRate <= 0 {
		cfg.SnapshotRate = raftgroup.DefaultSnapshotRate
	}
	if cfg.MaxMoves <= 0 {
		cfg.MaxMoves = 2
	}
	if cfg.LeaseSettle <= 0 {
		cfg.LeaseSettle = 30 * time.Second
	}
	return &Queue{c: c, cfg: cfg, flights: map[flight]time.Time{}, running: map[uint64]runningStep{}}
}

// Run plans every Interval while this node leads the region's directory
// and starts each plan's steps (at most MaxMoves replica moves, so as many
// snapshots, under way at once), until ctx ends; it returns once the steps
// it started have ended.
func (q *Queue) Run(ctx context.Context) {
	defer q.steps.Wait()
	for transport.SleepCtx(ctx, q.cfg.Interval) {
		if !q.c.Leads() {
			continue
		}
		q.Once(ctx)
	}
}

// Once plans one round and starts its steps, each bounded by
// stepTimeout; it returns the steps it started without waiting for
// them: a slow step (a snapshot to stream, a range whose leader is cut
// off) holds back only its own range or group, and the next rounds plan
// around it. Wait waits for the steps.
func (q *Queue) Once(ctx context.Context) []Action {
	busy := q.inFlight(time.Now()) // before the view: a step that ends meanwhile lingers
	vctx, cancel := context.WithTimeout(ctx, q.cfg.ActionTimeout)
	v, err := q.c.View(vctx)
	cancel()
	if err != nil {
		return nil
	}
	v.InFlight = busy
	if q.cfg.AutoRehome {
		v.RipeRehomes = q.ripeRehomes(AutoRehomeCandidates(v), time.Now())
	}
	plan := q.settle(Plan(v, q.cfg.Config), time.Now())
	for _, a := range plan {
		q.start(ctx, a, q.stepTimeout(a, v.Load))
	}
	return plan
}

// stepTimeout bounds step a: ActionTimeout, and for a step that streams a
// range's snapshot, twice what streaming it takes on top (the range's
// size on disk, as load reports it, streams about twice over as read, and
// MaxMoves streams share the node's SnapshotRate): a 512 MiB range gets
// about 158 s; a range of a few MiB, or of unknown size, ActionTimeout
// and a little. The stream itself gives up after 20 s without progress.
func (q *Queue) stepTimeout(a Action, load map[uint64]Load) time.Duration {
	if !a.streams() || a.Range == nil {
		return q.cfg.ActionTimeout
	}
	streamed := 2 * float64(load[a.Range.GetRangeId()].Bytes) * float64(max(q.cfg.MaxMoves, 1))
	return q.cfg.ActionTimeout + time.Duration(2*streamed/q.cfg.SnapshotRate*float64(time.Second))
}

// inFlight returns what plans must leave alone at now, dropping what
// lingered long enough.
func (q *Queue) inFlight(now time.Time) InFlight {
	q.mu.Lock()
	defer q.mu.Unlock()
	f := InFlight{Ranges: map[uint64]bool{}, Groups: map[uint64]bool{}, Gone: map[uint64]bool{}, Moves: q.moves}
	for k, until := range q.flights {
		if !until.IsZero() && !now.Before(until) {
			delete(q.flights, k)
			continue
		}
		switch k.kind {
		case Move:
			f.Ranges[k.id] = true
		case MoveGroup:
			f.Groups[k.id] = true
		case Gone:
			f.Gone[k.id] = true
		}
	}
	return f
}

// Wait waits until every step started so far has ended.
func (q *Queue) Wait() { q.steps.Wait() }

// start runs a in its own goroutine, marked in flight until it ends.
func (q *Queue) start(ctx context.Context, a Action, timeout time.Duration) {
	q.track(a, true)
	q.mu.Lock()
	q.stepSeq++
	seq := q.stepSeq
	q.running[seq] = runningStep{a: a, began: time.Now()}
	q.mu.Unlock()
	q.steps.Add(1)
	go func() {
		defer q.steps.Done()
		defer q.track(a, false)
		actx, cancel := context.WithTimeout(ctx, timeout)
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
		case MoveNonVoter:
			err = q.c.MoveNonVoter(actx, a.Range.GetStartKey(), a.From, a.To)
		case Split:
			err = q.c.Split(actx, a.Key)
		case AddNonVoter:
			err = q.c.AddNonVoter(actx, a.Range.GetStartKey(), a.To)
		case Rehome:
			err = q.c.Rehome(actx, a.Range.GetStartKey(), a.Home)
		}
		q.count(seq, a, err)
		if err != nil {
			slog.Info("rebalance: step failed", "kind", a.Kind, "range", a.Range.GetRangeId(), "group", a.Group, "from", a.From, "to", a.To, "why", a.Why, "err", err)
			return
		}
		slog.Info("rebalance: step done", "kind", a.Kind, "range", a.Range.GetRangeId(), "group", a.Group, "from", a.From, "to", a.To, "why", a.Why)
	}()
}

// track marks a under way (on) or ended: an ended step lingers in flight
// for an Interval.
func (q *Queue) track(a Action, on bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if on {
		q.flights[flightOf(a)] = time.Time{}
	} else {
		q.flights[flightOf(a)] = time.Now().Add(q.cfg.Interval)
	}
	if a.streams() {
		if on {
			q.moves++
		} else {
			q.moves--
		}
	}
}

// count adds the outcome of step seq, a, to the queue's stats; the step
// is no longer under way.
func (q *Queue) count(seq uint64, a Action, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.running, seq)
	if err != nil {
		q.stats.Failed[a.Kind]++
		q.stats.LastFailed = fmt.Sprintf("%s at %s: %v", a, time.Now().Format(time.TimeOnly), err)
	} else {
		q.stats.Done[a.Kind]++
	}
}

// Stats returns what the queue did so far, and the steps under way.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	st.InFlight = len(q.running)
	steps := slices.SortedFunc(maps.Values(q.running), func(x, y runningStep) int { return x.began.Compare(y.began) })
	for _, s := range steps {
		st.Running = append(st.Running, fmt.Sprintf("%s since %s", s.a, s.began.Format(time.TimeOnly)))
	}
	return st
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

// ripeRehomes returns the candidates (AutoRehomeCandidates) that have
// been candidates, for the same region, in every round for
// AutoRehomeAfter: the hysteresis that keeps a range whose writers
// alternate from moving back and forth (DESIGN.md §13).
func (q *Queue) ripeRehomes(candidates map[uint64]AutoRehome, now time.Time) map[uint64]AutoRehome {
	q.mu.Lock()
	defer q.mu.Unlock()
	since := map[uint64]autoRehome{}
	ripe := map[uint64]AutoRehome{}
	for id, c := range candidates {
		prev, ok := q.autoRehomes[id]
		if !ok || prev.region != c.Region {
			prev = autoRehome{region: c.Region, since: now}
		}
		since[id] = prev
		if now.Sub(prev.since) >= q.cfg.AutoRehomeAfter {
			ripe[id] = c
		}
	}
	q.autoRehomes = since
	return ripe
}

// autoRehome is since when an automatic rehome of a range to region has
// been planned in every round.
type autoRehome struct {
	region string
	since  time.Time
}
