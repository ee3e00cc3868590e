package epoch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// ErrUnavailable is returned when no majority of replicas agreed on an epoch
// within the reader's round timeout.
var ErrUnavailable = errors.New("epoch: no majority of replicas agreed")

// ErrReaderClosed is returned by Read after Close.
var ErrReaderClosed = errors.New("epoch: reader closed")

// DefaultRoundTimeout bounds one batched round of reads: 2 s.
const DefaultRoundTimeout = 2 * time.Second

// Reader reads an epoch group with the monotonic epoch invariant (DESIGN.md §3.1:
// once a read returns e, every read that starts later returns ≥ e). As in the
// paper (§2.2), an epoch counts as advanced once a majority of replicas has
// applied it; with that, reads are linearizable.
//
// Every replica's applied epoch only grows (a restarted replica serves nothing
// until it has applied what the group had committed when it came back, learned
// through a Raft ReadIndex). A read
// returns e only when a majority of replicas report exactly e (paper §2.2). Two
// majorities share a replica, so a later read's majority value is at least e.
// When the replies split, the reader asks again. The group's configuration
// may change (replica moves, DESIGN.md §12): replies name the configuration
// their epoch was applied under, the majority is counted in the newest one
// named, in both halves of a joint one, and the reader follows the voters it
// names (quorum.go gives the argument).
//
// Concurrent Read calls are batched: callers that arrive while a round is in
// flight wait for the next round, which starts after they called, and that round
// sends one request per replica it asks for all of them: a bare majority
// first, the other voters when those do not decide (firstAsks).
//
// The goroutines that run rounds and ask replicas live as long as the
// reader (issue 17): one runs rounds, and one per replica asks it. A
// goroutine started for each round and each request grew its stack anew
// every time (gRPC's call path is deep): about 3% of a range leader's CPU
// under load. A request to a replica whose asker is still waiting on an
// earlier one gets a goroutine of its own, so a slow replica delays no
// round. Close stops them all.
type Reader struct {
	group   uint64
	region  string
	boot    []uint64 // the voters the reader started from: the bootstrap configuration
	confMu  sync.Mutex
	known   config // under confMu: the newest configuration a reply named
	dialer  *transport.Dialer
	timeout time.Duration
	self    uint64     // with serve: the node this reader runs on (0: none)
	serve   ServeEpoch // answers for self's replica without a network round trip
	// call asks node id's replica: readRemote, or a test's fake.
	call func(ctx context.Context, id uint64, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error)

	mu      sync.Mutex
	waiting []chan readResult
	paced   bool // under mu: a caller in waiting wants the full pace (not ReadBackground)
	running bool // under mu: the round goroutine (loop) has started
	closed  bool
	askers  map[uint64]chan askJob // under mu: each replica's asker goroutine, by node
	kick    chan struct{}          // tells loop a caller is waiting (buffered 1)
	done    chan struct{}          // closed by Close: loop and the askers return
	wg      sync.WaitGroup

	// lastPaced is whether the batch loop took last wants the full pace
	// (loop's alone).
	lastPaced bool

	rounds, splits, hedges atomic.Uint64
	preferred              atomic.Uint64 // a voter that agreed with the last decision (firstAsks)

	// demanded is when (ns since demandOrigin; 0: never) an attempt that
	// asks for the epoch last asked every voter; demandEvery how often one
	// does (demandDue).
	demanded    atomic.Int64
	demandEvery time.Duration
}

type readResult struct {
	epoch uint64
	err   error
}

// NewReader returns a reader of epoch group g, calling its replicas through
// dialer. It starts from the topology's replicas (the bootstrap
// configuration) and follows the group's configuration from the replies;
// when none of the voters it knows answers, it asks the nodes of g's region
// where the group went (transport.LocateGroup).
func NewReader(dialer *transport.Dialer, g topology.Group) *Reader {
	boot := slices.Clone(g.Replicas)
	r := &Reader{group: g.ID, region: g.Region, boot: boot, known: config{halves: [][]uint64{boot}}, dialer: dialer, timeout: DefaultRoundTimeout,
		askers: map[uint64]chan askJob{}, kick: make(chan struct{}, 1), done: make(chan struct{}), demandEvery: PaceHold / 4}
	r.call = r.readRemote
	return r
}

// ServeEpoch answers a ReadEpoch as the Epoch service does (Server.ReadEpoch).
type ServeEpoch func(ctx context.Context, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error)

// ServeLocally makes the reader ask node self's replica through serve, in
// this process, instead of by RPC (issue 17: an epoch read pays a network
// round trip only for the other replicas). The answer is the same replica's
// and counts in the majority as any other. Call it before the first Read.
func (r *Reader) ServeLocally(self uint64, serve ServeEpoch) {
	r.self, r.serve = self, serve
}

// Read returns the current epoch. It fails with ErrUnavailable when no majority
// agrees within the round timeout, or with ctx's error. It asks the group to
// keep its full pace (Demand).
func (r *Reader) Read(ctx context.Context) (uint64, error) { return r.read(ctx, false) }

// ReadBackground is Read for housekeeping that does not need the epoch to
// move: it leaves an idle local epoch, publisher or global epoch service at
// its idle pace (Demand; issue 17). It is batched with Read calls, and a
// round that serves any Read asks for the full pace. Errors as Read.
func (r *Reader) ReadBackground(ctx context.Context) (uint64, error) { return r.read(ctx, true) }

func (r *Reader) read(ctx context.Context, background bool) (uint64, error) {
	ch, err := r.start(background)
	if err != nil {
		return 0, err
	}
	return wait(ctx, ch)
}

// start joins the next round: its result arrives on the channel returned.
// Errors: ErrReaderClosed.
func (r *Reader) start(background bool) (<-chan readResult, error) {
	ch := make(chan readResult, 1)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrReaderClosed
	}
	r.waiting = append(r.waiting, ch)
	r.paced = r.paced || !background
	if !r.running {
		r.running = true
		r.wg.Add(1)
		go r.loop()
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default: // already kicked: the loop takes every caller waiting when it wakes
	}
	return ch, nil
}

// wait returns the result of a read start began, or ctx's error.
func wait(ctx context.Context, ch <-chan readResult) (uint64, error) {
	select {
	case res := <-ch:
		return res.epoch, res.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Stats returns how many rounds the reader ran, how many of their attempts
// found the replicas split (and asked again), and how many attempts asked
// more than the bare majority they asked first (firstAsks).
func (r *Reader) Stats() (rounds, splits, hedges uint64) {
	return r.rounds.Load(), r.splits.Load(), r.hedges.Load()
}

// Close waits for the round in flight and makes later reads fail; the
// reader's goroutines have returned when it does.
func (r *Reader) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.done)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// loop runs a round for the callers waiting whenever there are any, until
// Close; callers still waiting then get ErrReaderClosed.
func (r *Reader) loop() {
	defer r.wg.Done()
	for {
		select {
		case <-r.kick:
		case <-r.done:
			for _, ch := range r.take() {
				ch <- readResult{err: ErrReaderClosed}
			}
			return
		}
		for {
			batch := r.take()
			if len(batch) == 0 {
				break
			}
			e, err := r.round(!r.lastPaced)
			for _, ch := range batch {
				ch <- readResult{e, err}
			}
		}
	}
}

// take returns the callers waiting and forgets them; lastPaced records
// whether any of them wants the full pace.
func (r *Reader) take() []chan readResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	batch := r.waiting
	r.lastPaced = r.paced
	r.waiting, r.paced = nil, false
	return batch
}

// round asks the replicas until a majority agrees or the round times out.
func (r *Reader) round(background bool) (uint64, error) {
	r.rounds.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	return r.until(ctx, &epochpb.ReadEpochRequest{GroupId: r.group, Background: background}, (*tally).decide)
}

// atLeastWait is how long a replica AtLeast asks waits for the epoch to
// reach it before answering (epochpb.ReadEpochRequest.wait_us): a follower
// answers the moment it applies the epoch: the leader sends the commit
// to its followers as soon as it learns it, not with its next heartbeat.
const atLeastWait = 50 * time.Millisecond

// AtLeast returns once a majority of the group's replicas (of each half of
// its newest configuration) has applied an epoch of at least e, so that
// every read that starts later returns at least e (quorum.go): the wait a
// publisher makes before it acknowledges a global epoch (DESIGN.md §3.2),
// and the service before it publishes one. Each replica asked answers once
// it has applied e, or after atLeastWait. Unlike Read it needs no majority
// on one value, so replicas that are still applying the epochs after e do
// not make it ask again. It is
// housekeeping: it does not ask for the epoch to move (Demand). It is not
// batched, and Close waits for it (at most the round timeout, 2 s). Errors:
// ErrReaderClosed; ErrUnavailable (wrapping the last reply's error) after
// the round timeout or when ctx ends.
func (r *Reader) AtLeast(ctx context.Context, e uint64) error {
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.wg.Add(1) // ask's goroutines count in wg: Close waits for them
	}
	r.mu.Unlock()
	if closed {
		return ErrReaderClosed
	}
	defer r.wg.Done()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	req := &epochpb.ReadEpochRequest{GroupId: r.group, Background: true, AtLeast: e, WaitUs: uint32(atLeastWait / time.Microsecond)}
	_, err := r.until(ctx, req, func(t *tally) (uint64, bool) { return e, t.reached(e) })
	return err
}

// until runs attempts of req, backing off between them, until one's tally
// decides (decide) or ctx ends (ErrUnavailable).
func (r *Reader) until(ctx context.Context, req *epochpb.ReadEpochRequest, decide func(*tally) (uint64, bool)) (uint64, error) {
	var lastErr error
	for attempt := 0; ; attempt++ {
		e, ok, lost, err := r.attempt(ctx, req, decide)
		if ok {
			return e, nil
		}
		if err != nil {
			lastErr = err
		}
		r.splits.Add(1)
		if lost {
			r.relocate(ctx)
		}
		// Back off briefly: a split clears as soon as the lagging replica applies.
		if !transport.SleepCtx(ctx, backoff(attempt)) {
			if lastErr == nil {
				lastErr = ctx.Err()
			}
			return 0, fmt.Errorf("%w: group %d: %v", ErrUnavailable, r.group, lastErr)
		}
	}
}

// backoff is 100 µs doubling to 12.8 ms.
func backoff(attempt int) time.Duration { return 100 * time.Microsecond << min(attempt, 7) }

// attempt asks every voter of the newest configuration the reader knows,
// and the voters of any newer one a reply names, and returns as soon as a
// majority of each half of the newest configuration reports the same epoch
// under it (quorum.go), or whatever decide wants; ok is false if the
// replies split or too many failed, and lost true if no voter of the newest
// configuration answered.
func (r *Reader) attempt(ctx context.Context, req *epochpb.ReadEpochRequest, decide func(*tally) (uint64, bool)) (epoch uint64, ok, lost bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	known := r.knownConf()
	t := newTally(known)
	replies := make(chan reply, 8)
	asked := make([]uint64, 0, 5)
	ask := func(c config) {
		for _, half := range c.halves {
			for _, id := range half {
				if slices.Contains(asked, id) {
					continue
				}
				asked = append(asked, id)
				r.send(askJob{ctx: ctx, node: id, req: req, replies: replies})
			}
		}
	}
	// A bare majority first; the other voters once one of those fails,
	// they answer without deciding, or hedgeAfter (waitHedgeAfter) passes.
	var hedge <-chan time.Time
	all := true
	if first := r.firstAsks(known); first != nil && (req.GetBackground() || !r.demandDue()) {
		ask(config{index: known.index, halves: [][]uint64{first}})
		all = false
		after := hedgeAfter
		if req.GetWaitUs() > 0 {
			after = waitHedgeAfter
		}
		tm := time.NewTimer(after)
		defer tm.Stop()
		hedge = tm.C
	} else {
		ask(known)
	}
	askAll := func() {
		if !all {
			all, hedge = true, nil
			r.hedges.Add(1)
			ask(known)
		}
	}
	var grace <-chan time.Time // runs once a majority has answered without agreeing
	for n := 0; n < len(asked); n++ {
		var rep reply
		select {
		case rep = <-replies:
		case <-hedge:
			askAll()
			n-- // no reply taken
			continue
		case <-grace:
			return 0, false, false, err // a straggler: ask everyone again rather than wait for it
		case <-ctx.Done():
			return 0, false, false, ctx.Err()
		}
		if rep.err != nil {
			err = rep.err
			askAll()
		}
		if t.add(rep) {
			r.learn(t.newest) // later rounds start from it
			ask(t.newest)
		}
		if e, ok := decide(t); ok {
			r.prefer(t, e)
			return e, true, false, nil
		}
		if n+1 == len(asked) {
			askAll() // those asked first answered without deciding
		}
		if all && n+1 >= len(asked)/2+1 && grace == nil {
			tm := time.NewTimer(splitGrace)
			defer tm.Stop()
			grace = tm.C
		}
	}
	// Lost: no voter of the newest configuration answered (a replica that
	// left may still answer, under a configuration whose voters moved on).
	members := t.newest.members()
	lost = !slices.ContainsFunc(t.replies, func(rep reply) bool { return slices.Contains(members, rep.node) })
	return 0, false, lost, err
}

// hedgeAfter is how long an attempt waits for the bare majority it asked
// first before it asks the group's other voters too: 1 ms, ten loopback
// round trips of an epoch read.
const hedgeAfter = time.Millisecond

// waitHedgeAfter is hedgeAfter for an attempt whose replicas wait for the
// epoch (AtLeast): they answer when they apply it, which a follower does a
// few ms after its leader on a loaded machine (P90 4.4 ms under bench
// paper), so only a replica silent for longer is taken as slow.
const waitHedgeAfter = 5 * time.Millisecond

// demandDue reports whether an attempt that asks for the epoch should ask
// every voter now, which it does once per demandEvery (a quarter of
// PaceHold). The group's leader keeps the full pace only while reads that
// ask for it reach its own replica (Demand), and a bare majority asked
// first may leave the leader out: without this, reads served by two
// followers let the epoch fall to its idle pace under load.
func (r *Reader) demandDue() bool {
	now := max(int64(time.Since(demandOrigin)), 1)
	last := r.demanded.Load()
	return (last == 0 || now-last >= int64(r.demandEvery)) && r.demanded.CompareAndSwap(last, now)
}

// firstAsks returns the voters an attempt asks first under c, or nil to
// ask them all at once (a joint configuration, or fewer than three
// voters): a bare majority of c's voters, led by this node's replica
// (answered in process, ServeLocally) and then the replica that last
// agreed with a decision (preferred). A read needs a majority reporting
// the same epoch (quorum.go), so asking the others too bought only a
// spare: one RPC in three of every read (issue 17). Replicas that agreed
// last time most likely agree again: followers learn each epoch from the
// same message. Which voters are asked never changes what a read may
// return, only how many RPCs it takes: the decision rule is the tally's.
func (r *Reader) firstAsks(c config) []uint64 {
	if len(c.halves) != 1 || len(c.halves[0]) < 3 {
		return nil
	}
	half := c.halves[0]
	need := len(half)/2 + 1
	first := make([]uint64, 0, len(half))
	if r.serve != nil && slices.Contains(half, r.self) {
		first = append(first, r.self)
	}
	if p := r.preferred.Load(); p != r.self && slices.Contains(half, p) {
		first = append(first, p)
	}
	for _, id := range half {
		if !slices.Contains(first, id) {
			first = append(first, id)
		}
	}
	return first[:need]
}

// prefer records a replica other than this node's that reported e, the
// epoch t decided on, for the next attempts to ask first.
func (r *Reader) prefer(t *tally, e uint64) {
	for _, rep := range t.replies {
		if rep.node != r.self && rep.epoch == e {
			r.preferred.Store(rep.node)
			return
		}
	}
}

// knownConf returns the newest configuration the reader knows.
func (r *Reader) knownConf() config {
	r.confMu.Lock()
	defer r.confMu.Unlock()
	return r.known
}

// learn makes c the configuration later attempts start from, unless the
// reader knows a newer one (concurrent AtLeast calls learn too).
func (r *Reader) learn(c config) {
	r.confMu.Lock()
	defer r.confMu.Unlock()
	if c.index >= r.known.index {
		r.known = c
	}
}

// relocate asks the nodes of the group's region for its newest
// configuration, whose voters the next attempt asks (the halves of a joint
// one come with the replies).
func (r *Reader) relocate(ctx context.Context) {
	v, err := transport.LocateGroup(ctx, r.dialer, r.group, r.dialer.RegionNodes(r.region, r.knownConf().members()))
	if err == nil && len(v.Voters) > 0 {
		r.learn(config{index: v.ConfIndex, halves: [][]uint64{v.Voters}})
	}
}

// askJob is one ReadEpoch to send: req to node, in an attempt's ctx, its
// reply delivered on replies. req is shared by the attempt's jobs, read-only.
type askJob struct {
	ctx     context.Context
	node    uint64
	req     *epochpb.ReadEpochRequest
	replies chan<- reply
}

// send hands j to its replica's asker goroutine if that is idle, and
// otherwise (busy, not started yet, or the reader closed) runs it on a
// goroutine of its own. The attempt calling it holds a count of wg (a
// round, or AtLeast), so Close waits for what it starts.
func (r *Reader) send(j askJob) {
	r.mu.Lock()
	jobs, ok := r.askers[j.node]
	if !ok && !r.closed {
		jobs = make(chan askJob)
		r.askers[j.node] = jobs
		r.wg.Add(1)
		go r.asker(jobs)
	}
	r.mu.Unlock()
	select {
	case jobs <- j: // nil once closed: never ready
	default:
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.ask(j.ctx, j.node, j.req, j.replies)
		}()
	}
}

// asker sends the jobs handed to it, one at a time, until Close.
func (r *Reader) asker(jobs <-chan askJob) {
	defer r.wg.Done()
	for {
		select {
		case j := <-jobs:
			r.ask(j.ctx, j.node, j.req, j.replies)
		case <-r.done:
			return
		}
	}
}

// ask sends req to node id and delivers the reply, unless ctx ended (the
// attempt returned).
func (r *Reader) ask(ctx context.Context, id uint64, req *epochpb.ReadEpochRequest, replies chan<- reply) {
	rep := reply{node: id}
	var resp *epochpb.ReadEpochResponse
	if r.serve != nil && id == r.self {
		resp, rep.err = r.serve(ctx, req)
	} else {
		resp, rep.err = r.call(ctx, id, req)
	}
	if rep.err == nil {
		rep.epoch, rep.conf = resp.GetEpoch(), replyConfig(resp, r.boot)
	}
	select {
	case replies <- rep:
	case <-ctx.Done():
	}
}

// readRemote sends req to node id's replica by RPC: Reader.call's default.
func (r *Reader) readRemote(ctx context.Context, id uint64, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
	conn, err := r.dialer.Conn(id)
	if err != nil {
		return nil, err
	}
	return epochpb.NewEpochClient(conn).ReadEpoch(ctx, req)
}

// splitGrace is how long an attempt waits for the remaining replicas once a
// majority has answered without agreeing: 2 ms, several intra-region round trips.
const splitGrace = 2 * time.Millisecond

// Source reads an epoch; *Reader implements it.
type Source interface {
	Read(ctx context.Context) (uint64, error)
}

// backgroundSource is a Source that can read as housekeeping (*Reader).
type backgroundSource interface {
	ReadBackground(ctx context.Context) (uint64, error)
}

// ReadBackground reads src as housekeeping, leaving an idle epoch at its
// idle pace (Reader.ReadBackground); a Source without that kind of read is
// read with Read. Errors as src's.
func ReadBackground(ctx context.Context, src Source) (uint64, error) {
	if b, ok := src.(backgroundSource); ok {
		return b.ReadBackground(ctx)
	}
	return src.Read(ctx)
}

// ReadAll reads every source in parallel (a nil source is skipped and reads as
// 0) and returns the epochs in the order of sources, or the errors joined.
func ReadAll(ctx context.Context, sources ...Source) ([]uint64, error) {
	return StartAll(ctx, sources...)()
}

// StartAll begins ReadAll's reads and returns the function that waits for
// them and returns what ReadAll does, so a caller can work while the reads
// are under way: a range leader looks up its write set's newest versions
// (issue 17). Each read starts before StartAll returns, so the epochs are
// at least those of its call (DESIGN.md §3.1). A *Reader's read joins its
// next round with no goroutine of its own; any other Source is read on a
// goroutine. The function must be called once, and it waits for every
// read to end (ctx bounds them).
func StartAll(ctx context.Context, sources ...Source) func() ([]uint64, error) {
	out := make([]uint64, len(sources))
	errs := make([]error, len(sources))
	started := make([]<-chan readResult, len(sources))
	var wg sync.WaitGroup
	for i, src := range sources {
		switch src := src.(type) {
		case nil:
		case *Reader:
			started[i], errs[i] = src.start(false)
		default:
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i], errs[i] = src.Read(ctx)
			}()
		}
	}
	return func() ([]uint64, error) {
		for i, ch := range started {
			if ch != nil {
				out[i], errs[i] = wait(ctx, ch)
			}
		}
		wg.Wait()
		return out, errors.Join(errs...)
	}
}

// WaitAtLeast reads src every poll until it shows at least e, and returns the
// epoch read. It fails with the last read's error once ctx ends. Read errors
// before that are retried: a publisher refuses while its lease has lapsed.
func WaitAtLeast(ctx context.Context, src Source, e uint64, poll time.Duration) (uint64, error) {
	for {
		got, err := src.Read(ctx)
		if err == nil && got >= e {
			return got, nil
		}
		if ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("epoch: waiting for epoch %d, at %d: %w", e, got, ctx.Err())
			}
			return got, err
		}
		if !transport.SleepCtx(ctx, poll) {
			return got, fmt.Errorf("epoch: waiting for epoch %d, at %d: %w", e, got, ctx.Err())
		}
	}
}
