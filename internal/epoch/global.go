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
	quorum Source // a majority read of the publisher's own group

	start      time.Time    // monotonic origin of lastUpdate
	lastUpdate atomic.Int64 // ns since start of the last live update; 0: none
}

// NewPublisher ties a publisher's state machine to its group; lease is
// publisher_lease, and quorum reads the group as clients do (a Reader on it):
// Publish acknowledges an epoch only once quorum shows it.
func NewPublisher(group *raftgroup.Group, sm *StateMachine, lease time.Duration, quorum Source) *Publisher {
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
}

// Global is one node's replica of the global epoch service (paper §4.1,
// DESIGN.md §7). While it leads, it loops: push the current global epoch E to
// every publisher and wait until each has durably applied it, then durably
// advance to E+1. The global epoch invariant (DESIGN.md §3.2) follows: when the
// service reaches E+1 every publisher already holds E.
type Global struct {
	group       *raftgroup.Group
	sm          *StateMachine
	targets     []PublisherTarget
	clients     []*transport.LeaderClient
	tick        time.Duration
	minInterval time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewGlobal returns the global epoch service replica; tick is how often a
// follower checks whether it has become the leader, minInterval the least time
// between advances (0: none).
func NewGlobal(group *raftgroup.Group, sm *StateMachine, dialer *transport.Dialer, targets []PublisherTarget, tick, minInterval time.Duration) *Global {
	ctx, cancel := context.WithCancel(context.Background())
	g := &Global{group: group, sm: sm, targets: targets, tick: tick, minInterval: minInterval, ctx: ctx, cancel: cancel}
	for _, t := range targets {
		g.clients = append(g.clients, transport.NewLeaderClient(dialer, t.Replicas))
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
	for g.ctx.Err() == nil {
		st := g.group.Status()
		if st.Leader != st.Replica || !st.CaughtUp {
			transport.SleepCtx(g.ctx, g.tick)
			continue
		}
		e := g.sm.Epoch()
		if err := g.publishAll(e); err != nil {
			slog.Debug("global epoch: publishing failed", "epoch", e, "err", err)
			transport.SleepCtx(g.ctx, g.tick)
			continue
		}
		if wait := g.minInterval - time.Since(last); wait > 0 {
			transport.SleepCtx(g.ctx, wait)
		}
		ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
		_, err := g.group.Propose(ctx, EncodeAdvance(e))
		cancel()
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				slog.Debug("global epoch: advance failed", "epoch", e, "err", err)
			}
			continue
		}
		last = time.Now()
	}
}

// publishAll pushes e to every publisher in parallel and waits for all.
func (g *Global) publishAll(e uint64) error {
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	errs := make(chan error, len(g.clients))
	for i, c := range g.clients {
		go func(group uint64, c *transport.LeaderClient) {
			errs <- c.Call(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
				_, err := epochpb.NewEpochClient(conn).Publish(ctx, &epochpb.PublishRequest{GroupId: group, Epoch: e})
				return err
			})
		}(g.targets[i].Group, c)
	}
	var first error
	for range g.clients {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
