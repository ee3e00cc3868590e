package epoch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/transport"
)

// Publisher is one node's replica of a region's epoch publisher (paper §4.1,
// DESIGN.md §7): the global epoch as last pushed by the global epoch service. A
// replica serves only while fresh — updated within its lease — so a region cut
// off from the global service stops serving (and so stops committing) within
// the lease. Freshness counts only updates applied after the replica caught up
// following a restart, never replayed ones.
type Publisher struct {
	group  *raftgroup.Group
	sm     *StateMachine
	lease  time.Duration
	quorum Quorum // majority reads of the publisher's own group
	demand Demand // reads of the global epoch here, told to the service with each Publish

	start      time.Time    // monotonic origin of lastUpdate
	lastUpdate atomic.Int64 // ns since start of the last live update; 0: none
}

// Quorum certifies that a majority of a group's replicas has applied an
// epoch, so that every later read returns at least it; *Reader implements
// it (Reader.AtLeast, whose errors AtLeast returns: ErrUnavailable,
// ErrReaderClosed).
type Quorum interface {
	AtLeast(ctx context.Context, e uint64) error
}

// NewPublisher ties a publisher's state machine to its group; lease is
// publisher_lease, and quorum reads the group as clients do (a Reader on it):
// Publish acknowledges an epoch only once quorum shows a majority holds it.
func NewPublisher(group *raftgroup.Group, sm *StateMachine, lease time.Duration, quorum Quorum) *Publisher {
	p := &Publisher{group: group, sm: sm, lease: lease, quorum: quorum, start: time.Now()}
	sm.published = p.onPublish
	return p
}

func (p *Publisher) onPublish() {
	if p.group.Status().CaughtUp {
		p.lastUpdate.Store(max(int64(time.Since(p.start)), 1))
	}
}

// Fresh reports whether the replica was updated within its lease.
func (p *Publisher) Fresh() bool {
	last := p.lastUpdate.Load()
	return last != 0 && time.Duration(int64(time.Since(p.start))-last) < p.lease
}

// PublisherTarget is a publisher group the global epoch service updates.
type PublisherTarget struct {
	// Group is the publisher's group ID; Replicas its replicas' nodes.
	Group    uint64
	Replicas []uint64
	// Region is the region the publisher serves.
	Region string
}

// GlobalConfig tunes the global epoch service.
type GlobalConfig struct {
	// Tick is how often a follower checks whether it has become the leader.
	Tick time.Duration
	// MinInterval is the least time between advances (0: none).
	MinInterval time.Duration
	// PublisherLease is publisher_lease: how long a publisher serves after
	// its last update.
	PublisherLease time.Duration
	// AutoExcludeAfter excludes a publisher that has not acknowledged for this
	// long (0: never; an operator decides).
	AutoExcludeAfter time.Duration
	// IdleInterval is the least time between advances while no reader asks
	// for the global epoch (Demand), here or at a publisher (0: no idle
	// pace). At most a quarter of PublisherLease keeps publishers fresh.
	IdleInterval time.Duration
	// Observe receives the duration of each round's publish and advance
	// while this replica leads (nil: none).
	Observe RoundObserver
}

// publishTimeout bounds one round of Publish calls: half the publisher lease,
// so that while one publisher is silent the others are still refreshed within
// their lease. A publish not acknowledged by then is taken as applied at the
// latest then (messages are delivered within their RPC's deadline or never),
// which bounds an excluded publisher's lease.
func (g *Global) publishTimeout() time.Duration { return g.cfg.PublisherLease / 2 }

// Global is one node's replica of the global epoch service (paper §4.1,
// DESIGN.md §7). While it leads, it loops: push the current global epoch E to
// every publisher in its set and wait until each has durably applied it, then
// durably advance to E+1. The global epoch invariant (DESIGN.md §3.2) follows:
// when the service reaches E+1 every publisher already holds E.
//
// A publisher can be excluded from the set (by an operator, or by the automatic
// policy after AutoExcludeAfter without an acknowledgement) so that the rest of
// the world keeps advancing while its region is cut off (paper §5.5). The
// service then advances only once that publisher's lease has surely lapsed —
// PublisherLease after the last publish sent to it could have been applied,
// measured on this node's clock — so a cut-off region never serves an epoch
// more than one behind. An included publisher counts again from the next
// round: the service advances only once it has applied the current epoch.
type Global struct {
	group   *raftgroup.Group
	sm      *StateMachine
	targets []PublisherTarget
	clients []*transport.LeaderClient
	cfg     GlobalConfig
	quorum  Quorum // majority reads of the service's own group

	// certified is the newest epoch a majority of the service's replicas is
	// known to have applied (quorum): the newest it may publish.
	certified uint64

	// Leader-only state, touched by the loop goroutine alone.
	lastSent    []time.Time // per target: the last publish sent (at the lease's start, the conservative now)
	lastAcked   []time.Time // per target: the last acknowledgement, or its readmission
	wasExcluded []bool      // per target: excluded at the last round

	demand Demand // reads of the service's own replica (Server.AddGlobal)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewGlobal returns the global epoch service replica, updating targets;
// quorum reads the service's own group as clients do (a Reader on it): the
// service publishes an epoch only once quorum shows a majority holds it.
func NewGlobal(group *raftgroup.Group, sm *StateMachine, dialer *transport.Dialer, targets []PublisherTarget, quorum Quorum, cfg GlobalConfig) *Global {
	ctx, cancel := context.WithCancel(context.Background())
	g := &Global{group: group, sm: sm, targets: targets, cfg: cfg, quorum: quorum, ctx: ctx, cancel: cancel,
		lastSent: make([]time.Time, len(targets)), lastAcked: make([]time.Time, len(targets)), wasExcluded: make([]bool, len(targets))}
	for _, t := range targets {
		g.clients = append(g.clients, transport.NewLeaderClient(dialer, t.Replicas).Follow(t.Group, t.Region))
	}
	return g
}

// Start begins the advance loop.
func (g *Global) Start() {
	g.wg.Add(1)
	go g.loop()
}

// Close stops the loop and waits for it.
func (g *Global) Close() {
	g.cancel()
	g.wg.Wait()
}

func (g *Global) loop() {
	defer g.wg.Done()
	var last time.Time
	leading := false
	for g.ctx.Err() == nil {
		st := g.group.Status()
		if st.Leader != st.Replica || !st.CaughtUp {
			leading = false
			transport.SleepCtx(g.ctx, g.cfg.Tick)
			continue
		}
		if !leading {
			// A new leader cannot know what its predecessor sent: take every
			// publisher as just updated, and as just acknowledged.
			leading = true
			now := time.Now()
			for i := range g.targets {
				g.lastSent[i], g.lastAcked[i] = now, now
			}
		}
		e := g.sm.Epoch()
		if err := g.certify(e); err != nil {
			slog.Debug("global epoch: a majority of the service has not applied it", "epoch", e, "err", err)
			transport.SleepCtx(g.ctx, g.cfg.Tick)
			continue
		}
		began := time.Now()
		asked, err := g.publishAll(e)
		if err != nil {
			slog.Debug("global epoch: publishing failed", "epoch", e, "err", err)
			g.autoExclude()
			transport.SleepCtx(g.ctx, g.cfg.Tick)
			continue
		}
		g.observe(PhasePublish, time.Since(began))
		if wait := g.excludedLeaseWait(); wait > 0 {
			// Keep refreshing the others meanwhile.
			transport.SleepCtx(g.ctx, min(wait, g.cfg.PublisherLease/4))
			continue
		}
		if wait := g.cfg.MinInterval - time.Since(last); wait > 0 {
			transport.SleepCtx(g.ctx, wait)
		}
		g.idleWait(last, asked)
		began = time.Now()
		committed, err := g.advance(e)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				slog.Debug("global epoch: advance failed", "epoch", e, "err", err)
			}
			continue
		}
		last = time.Now()
		g.observe(PhaseAdvanceCommit, committed.Sub(began))
		g.observe(PhaseAdvance, last.Sub(began))
	}
}

// observe reports a phase's duration to the configured observer, if any.
func (g *Global) observe(p Phase, d time.Duration) {
	if g.cfg.Observe != nil {
		g.cfg.Observe(p, d)
	}
}

// advance durably advances the service from e to e+1 and returns when
// the service's leader had applied it (its proposal returned). It
// certifies e+1 meanwhile: the replicas asked answer as soon as they apply
// it, so certify has nothing left to wait for unless a majority had not
// applied e+1 by then. Errors: the proposal's.
func (g *Global) advance(e uint64) (committed time.Time, _ error) {
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	certified := make(chan error, 1)
	go func() { certified <- g.quorum.AtLeast(ctx, e+1) }()
	_, err := g.group.Propose(ctx, EncodeAdvance(e))
	committed = time.Now()
	if err != nil {
		cancel()
	}
	if cerr := <-certified; err == nil && cerr == nil {
		g.certified = max(g.certified, e+1)
	}
	return committed, err
}

// certify returns once a majority of the service's replicas has applied e,
// so that every read of the service from then on returns at least e. Only
// then may a publisher show e: a transaction that commits at e in a region
// must be seen by every strong snapshot that begins after it, and a strong
// snapshot reads at the service's epoch + 1 (DESIGN.md §5, §7). The leader
// alone having applied e is not enough: until its followers learn the
// commit, a majority read of the service can still return e-1. Errors:
// Quorum.AtLeast's, after publishTimeout.
func (g *Global) certify(e uint64) error {
	if e <= g.certified {
		return nil
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.publishTimeout())
	defer cancel()
	if err := g.quorum.AtLeast(ctx, e); err != nil {
		return err
	}
	g.certified = e
	return nil
}

// excludedLeaseWait returns how long until every excluded publisher's lease
// has surely lapsed (0: all have).
func (g *Global) excludedLeaseWait() time.Duration {
	var wait time.Duration
	for i, t := range g.targets {
		if g.sm.Excluded(t.Group) {
			wait = max(wait, time.Until(g.lastSent[i].Add(g.publishTimeout()+g.cfg.PublisherLease)))
		}
	}
	return wait
}

// autoExclude excludes, under the automatic policy, every publisher in the
// set that has not acknowledged for AutoExcludeAfter.
func (g *Global) autoExclude() {
	if g.cfg.AutoExcludeAfter <= 0 {
		return
	}
	for i, t := range g.targets {
		if g.sm.Excluded(t.Group) || time.Since(g.lastAcked[i]) < g.cfg.AutoExcludeAfter {
			continue
		}
		slog.Warn("global epoch: excluding a silent publisher", "region", t.Region, "publisher", t.Group,
			"silent_for", time.Since(g.lastAcked[i]).Round(time.Millisecond))
		ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
		_, err := g.group.Propose(ctx, EncodeExclude(t.Group))
		cancel()
		if err != nil {
			slog.Debug("global epoch: excluding failed", "publisher", t.Group, "err", err)
		}
	}
}

// idleWait holds the next advance, while no reader asks for the global
// epoch, until IdleInterval after the last one (issue 17: an idle cluster's
// epochs cost little). asked says a publisher reported a reader in its last
// acknowledgement; a read of the service's own replica ends the wait within
// a tick. Between advances the publishers hold the epoch the service does,
// so a strong snapshot that asks waits one advance, as at the full pace.
// The pace changes when epochs pass, never what DESIGN.md §3.2 needs.
func (g *Global) idleWait(last time.Time, asked bool) {
	if asked || g.cfg.IdleInterval <= 0 {
		return
	}
	for {
		now := time.Now()
		left := last.Add(g.cfg.IdleInterval).Sub(now)
		if left <= 0 || g.demand.Active(now) {
			return
		}
		if !transport.SleepCtx(g.ctx, min(left, g.cfg.Tick)) {
			return
		}
	}
}

// publishAll pushes e to every publisher in the set in parallel and waits
// for all; asked is true when one reported a reader asking for the epoch.
func (g *Global) publishAll(e uint64) (asked bool, _ error) {
	ctx, cancel := context.WithTimeout(g.ctx, g.publishTimeout())
	defer cancel()
	errs := make(chan error, len(g.clients))
	var active atomic.Bool
	n := 0
	for i, c := range g.clients {
		if g.sm.Excluded(g.targets[i].Group) {
			g.wasExcluded[i] = true
			continue
		}
		if g.wasExcluded[i] {
			// Readmitted: its silence is counted from now, not from before.
			g.wasExcluded[i], g.lastAcked[i] = false, time.Now()
		}
		n++
		g.lastSent[i] = time.Now()
		go func(i int, c *transport.LeaderClient) {
			err := c.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
				resp, err := epochpb.NewEpochClient(conn).Publish(ctx, &epochpb.PublishRequest{GroupId: g.targets[i].Group, Epoch: e})
				if resp.GetActive() {
					active.Store(true)
				}
				return err
			})
			if err == nil {
				g.lastAcked[i] = time.Now() // distinct index per goroutine; read after the wait below
			}
			errs <- err
		}(i, c)
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return active.Load(), first
}
