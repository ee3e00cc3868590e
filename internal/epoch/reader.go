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
// round. A joint round (Pair) reads the partner's group on a goroutine
// of its own. Close stops them all.
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
	partner *Reader    // Pair: the group read in joint rounds with this one (nil: none)
	// call asks node id's replica: readRemote, or a test's fake; callMany
	// asks node id's replicas of several groups: readRemoteMany, or a fake.
	call     func(ctx context.Context, id uint64, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error)
	callMany func(ctx context.Context, id uint64, reqs []*epochpb.ReadEpochRequest) (*epochpb.ReadEpochsResponse, error)

	mu      sync.Mutex
	waiting []waiter
	paced   bool // under mu: a caller in waiting wants the full pace (not ReadBackground)
	joint   bool // under mu: a caller in waiting wants the partner's epoch too (Pair)
	running bool // under mu: the round goroutine (loop) has started
	closed  bool
	askers  map[uint64]chan askJob // under mu: each replica's asker goroutine, by node
	kick    chan struct{}          // tells loop a caller is waiting (buffered 1)
	done    chan struct{}          // closed by Close: loop and the askers return
	wg      sync.WaitGroup

	// lastPaced and lastJoint are whether the batch loop took last wants
	// the full pace and the partner's epoch (loop's alone).
	lastPaced, lastJoint bool

	rounds, splits, hedges atomic.Uint64
	// reads, waitedNs and roundNs add up, over the rounds run: the reads
	// they answered, how long those waited for their round to begin (ns),
	// and how long the rounds took to decide this group's epoch (ns).
	reads, waitedNs, roundNs atomic.Uint64
	preferred                atomic.Uint64 // a voter that agreed with the last decision (firstAsks)

	// demanded is when (ns since demandOrigin; 0: never) an attempt that
	// asks for the epoch last asked every voter; demandEvery how often one
	// does (demandDue).
	demanded    atomic.Int64
	demandEvery time.Duration

	// decideNs is the moving mean (ns; 0: none yet) of how long the
	// reader's attempts that asked a bare majority first took to decide
	// (observeDecide), from which hedgeAfter derives.
	decideNs atomic.Int64
}

// waiter is a caller waiting for the next round, and whether it wants the
// partner's epoch too (joint: Pair).
type waiter struct {
	ch    chan readResult
	joint bool
	at    time.Time // when it joined: its wait for the round counts from it
}

// readResult is a round's answer: the group's epoch or err, and in a
// joint round (Pair) the partner group's epoch or partnerErr.
type readResult struct {
	epoch      uint64
	err        error
	partner    uint64
	partnerErr error
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
	r.call, r.callMany = r.readRemote, r.readRemoteMany
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

// Ask joins the next round as a read that asks for the full pace (Demand)
// and returns without waiting for its epoch: for a caller that waits for
// epochs to pass and learns of them another way, as a changefeed reads
// ranges' closed epochs (issue 17: commits no longer keep an epoch at its
// full pace). Errors: ErrReaderClosed.
func (r *Reader) Ask() error {
	_, err := r.start(false, false) // the round's result fills a buffered channel no one reads
	return err
}

func (r *Reader) read(ctx context.Context, background bool) (uint64, error) {
	ch, err := r.start(background, false)
	if err != nil {
		return 0, err
	}
	res := wait(ctx, ch)
	return res.epoch, res.err
}

// start joins the next round, which reads the partner's group too if
// joint (Pair): its result arrives on the channel returned. Errors:
// ErrReaderClosed.
func (r *Reader) start(background, joint bool) (<-chan readResult, error) {
	ch := make(chan readResult, 1)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrReaderClosed
	}
	r.waiting = append(r.waiting, waiter{ch: ch, joint: joint, at: time.Now()})
	r.paced = r.paced || !background
	r.joint = r.joint || joint
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
func wait(ctx context.Context, ch <-chan readResult) readResult {
	select {
	case res := <-ch:
		return res
	case <-ctx.Done():
		return readResult{err: ctx.Err(), partnerErr: ctx.Err()}
	}
}

// ReaderStats counts what a Reader's rounds did since it was made
// (Reader.Stats).
type ReaderStats struct {
	// Rounds is how many rounds ran; Reads how many reads (Read,
	// ReadBackground, Ask, a StartAll's joint read) they answered.
	Rounds, Reads uint64
	// Splits is how many attempts found the replicas split (and asked
	// again); Hedges how many asked more than the bare majority they asked
	// first (firstAsks).
	Splits, Hedges uint64
	// Waited is the time the reads answered spent waiting for their round
	// to begin, summed over them: a read that arrives while a round is in
	// flight waits for it to end (issue 17: under load that is about half
	// a round). InRounds is the time the rounds took to decide this
	// group's epoch, summed over the rounds.
	Waited, InRounds time.Duration
}

// Stats returns what the reader's rounds did since it was made. AtLeast
// runs no round: it counts only in Splits and Hedges.
func (r *Reader) Stats() ReaderStats {
	return ReaderStats{Rounds: r.rounds.Load(), Reads: r.reads.Load(), Splits: r.splits.Load(), Hedges: r.hedges.Load(),
		Waited: time.Duration(r.waitedNs.Load()), InRounds: time.Duration(r.roundNs.Load())}
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
			answer(r.take(), readResult{err: ErrReaderClosed, partnerErr: ErrReaderClosed}, func(waiter) bool { return true })
			return
		}
		for {
			batch := r.take()
			if len(batch) == 0 {
				break
			}
			r.round(!r.lastPaced, r.lastJoint, batch)
		}
	}
}

// answer sends res to each waiter of batch that to reports true for.
func answer(batch []waiter, res readResult, to func(waiter) bool) {
	for _, w := range batch {
		if to(w) {
			w.ch <- res
		}
	}
}

func wantsPartner(w waiter) bool { return w.joint }
func wantsOwn(w waiter) bool     { return !w.joint }

// take returns the callers waiting and forgets them; lastPaced and
// lastJoint record whether any of them wants the full pace, and the
// partner's epoch.
func (r *Reader) take() []waiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	batch := r.waiting
	r.lastPaced, r.lastJoint = r.paced, r.joint
	r.waiting, r.paced, r.joint = nil, false, false
	return batch
}

// round asks the replicas until a majority agrees or the round times out,
// and answers batch. A joint one reads the partner's group too (Pair), its
// first asks sent with this group's (askJointly): the callers that want
// only this group's epoch are answered once it is decided, and the
// partner's read goes on on a goroutine of its own, so that a slow or
// unavailable partner (a publisher whose lease lapsed) holds up neither
// them nor the next round (a leaseholder renewing its lease).
func (r *Reader) round(background, joint bool, batch []waiter) {
	began := time.Now()
	r.rounds.Add(1)
	var waited time.Duration
	for _, w := range batch {
		waited += began.Sub(w.at)
	}
	r.reads.Add(uint64(len(batch)))
	r.waitedNs.Add(uint64(waited))
	decided := func() { r.roundNs.Add(uint64(time.Since(began))) }
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	req := &epochpb.ReadEpochRequest{GroupId: r.group, Background: background}
	p := r.partner
	if !joint || p == nil || !p.hold() {
		defer cancel()
		res := readResult{}
		if joint {
			res.partnerErr = ErrReaderClosed // the partner closed
		}
		res.epoch, res.err = r.until(ctx, req, (*tally).decide, nil)
		decided()
		answer(batch, res, func(waiter) bool { return true })
		return
	}
	preq := &epochpb.ReadEpochRequest{GroupId: p.group, Background: background}
	mine, theirs := r.askJointly(ctx, req, preq)
	e, err := r.until(ctx, req, (*tally).decide, mine)
	decided()
	answer(batch, readResult{epoch: e, err: err}, wantsOwn)
	r.wg.Add(1) // the loop holds a count: Close waits for this one too
	go func() {
		defer r.wg.Done()
		defer p.wg.Done()
		defer cancel()
		g, perr := p.until(ctx, preq, (*tally).decide, theirs)
		answer(batch, readResult{epoch: e, err: err, partner: g, partnerErr: perr}, wantsPartner)
	}()
}

// hold counts a caller outside the reader's rounds (AtLeast, a partner's
// joint round) in wg, so that Close waits for what it sends; it reports
// false once the reader is closed. The caller calls wg.Done when done.
func (r *Reader) hold() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	return true
}

// firstAsk is what an attempt goes on from when its first asks were sent
// for it (askJointly): the configuration they went to, the voters asked,
// whether those are all of its voters, and where their replies arrive.
type firstAsk struct {
	known   config
	asked   []uint64
	all     bool
	replies chan reply
}

// plan returns the voters an attempt under known asks first, led by
// prefer (firstAsks), and whether they are all of known's voters: all of
// them when the configuration is joint or small, or when a read that asks
// for the epoch is due to ask everyone (demandDue).
func (r *Reader) plan(known config, background bool, prefer uint64) (nodes []uint64, all bool) {
	if first := r.firstAsks(known, prefer); first != nil && (background || !r.demandDue()) {
		return first, false
	}
	return known.members(), true
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
	if !r.hold() { // ask's goroutines count in wg: Close waits for them
		return ErrReaderClosed
	}
	defer r.wg.Done()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	req := &epochpb.ReadEpochRequest{GroupId: r.group, Background: true, AtLeast: e, WaitUs: uint32(atLeastWait / time.Microsecond)}
	_, err := r.until(ctx, req, func(t *tally) (uint64, bool) { return e, t.reached(e) }, nil)
	return err
}

// until runs attempts of req, backing off between them, until one's tally
// decides (decide) or ctx ends (ErrUnavailable). The first attempt goes on
// from first when it is not nil (its asks already sent: askJointly).
func (r *Reader) until(ctx context.Context, req *epochpb.ReadEpochRequest, decide func(*tally) (uint64, bool), first *firstAsk) (uint64, error) {
	var lastErr error
	for attempt := 0; ; attempt++ {
		e, ok, lost, err := r.attempt(ctx, req, decide, first)
		first = nil
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
// configuration answered. It goes on from first when that is not nil: its
// first asks were sent for it (askJointly).
func (r *Reader) attempt(ctx context.Context, req *epochpb.ReadEpochRequest, decide func(*tally) (uint64, bool), first *firstAsk) (epoch uint64, ok, lost bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if first == nil {
		first = &firstAsk{known: r.knownConf(), replies: make(chan reply, 8)}
		var nodes []uint64
		nodes, first.all = r.plan(first.known, req.GetBackground(), r.preferred.Load())
		for _, id := range nodes {
			first.asked = append(first.asked, id)
			r.send(askJob{ctx: ctx, node: id, parts: []askPart{{req: req, replies: first.replies, boot: r.boot}}})
		}
	}
	known, replies, all := first.known, first.replies, first.all
	t := newTally(known)
	asked := append(make([]uint64, 0, 5), first.asked...)
	ask := func(c config) {
		for _, half := range c.halves {
			for _, id := range half {
				if slices.Contains(asked, id) {
					continue
				}
				asked = append(asked, id)
				r.send(askJob{ctx: ctx, node: id, parts: []askPart{{req: req, replies: replies, boot: r.boot}}})
			}
		}
	}
	// A bare majority first; the other voters once one of those fails,
	// they answer without deciding, or hedgeAfter (waitHedgeAfter) passes.
	// An attempt that asked a bare majority for a plain read feeds the
	// time it took into the next ones' hedgeAfter.
	var hedge <-chan time.Time
	waits := req.GetWaitUs() > 0
	bare, began := !all && !waits, time.Now()
	if !all {
		after := waitHedgeAfter
		if !waits {
			after = r.hedgeAfter()
		}
		tm := time.NewTimer(after)
		defer tm.Stop()
		hedge = tm.C
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
			if bare {
				r.observeDecide(time.Since(began))
			}
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

// An attempt waits hedgeTimes its reader's recent time to decide, within
// [hedgeMin, hedgeMax], for the bare majority it asked first before it
// asks the group's other voters too (hedgeAfter): a hedge is for the
// slowest attempts, not the usual one. hedgeMin, 1 ms, is ten loopback
// round trips of an idle epoch read. Under load an attempt takes 1–2 ms
// (issue 17: the remote replica's reply waits its turn on a busy
// machine), so a fixed 1 ms hedged 57% of the attempts, a third RPC for
// more than half the rounds; at twice the mean, only the slow tail does.
// hedgeMax, 5 ms, bounds what one silent replica costs an attempt before
// it asks the others (after which it prefers one that answered).
const (
	hedgeMin   = time.Millisecond
	hedgeMax   = 5 * time.Millisecond
	hedgeTimes = 2
)

// decideWeight is the weight of the newest attempt in decideNs's moving
// mean: 1/8.
const decideWeight = 8

// hedgeAfter returns how long an attempt that asked a bare majority first
// waits for it before asking the other voters (hedgeTimes the recent time
// to decide, within [hedgeMin, hedgeMax]).
func (r *Reader) hedgeAfter() time.Duration {
	return min(max(hedgeTimes*time.Duration(r.decideNs.Load()), hedgeMin), hedgeMax)
}

// observeDecide adds d, how long an attempt that asked a bare majority
// first took to decide (hedged or not), to decideNs's moving mean.
func (r *Reader) observeDecide(d time.Duration) {
	for {
		old := r.decideNs.Load()
		next := int64(d)
		if old != 0 {
			next = old + (int64(d)-old)/decideWeight
		}
		if r.decideNs.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// waitHedgeAfter replaces hedgeAfter for an attempt whose replicas wait for the
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
// (answered in process, ServeLocally) and then prefer: the replica that
// last agreed with a decision (preferred), or in a joint round (Pair) the
// one the other group asks. A read needs a majority reporting
// the same epoch (quorum.go), so asking the others too bought only a
// spare: one RPC in three of every read (issue 17). Replicas that agreed
// last time most likely agree again: followers learn each epoch from the
// same message. Which voters are asked never changes what a read may
// return, only how many RPCs it takes: the decision rule is the tally's.
func (r *Reader) firstAsks(c config, prefer uint64) []uint64 {
	if len(c.halves) != 1 || len(c.halves[0]) < 3 {
		return nil
	}
	half := c.halves[0]
	need := len(half)/2 + 1
	first := make([]uint64, 0, len(half))
	if r.serve != nil && slices.Contains(half, r.self) {
		first = append(first, r.self)
	}
	if prefer != r.self && slices.Contains(half, prefer) {
		first = append(first, prefer)
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

// splitGrace is how long an attempt waits for the remaining replicas once a
// majority has answered without agreeing: 2 ms, several intra-region round trips.
const splitGrace = 2 * time.Millisecond
