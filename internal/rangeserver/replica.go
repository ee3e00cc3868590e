package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// EpochSource reads an epoch: the region's local epoch, or its publisher.
type EpochSource = epoch.Source

// Epochs are the epochs a range leader reads.
type Epochs struct {
	// Local is the region's local epoch (leases, regional versions).
	Local EpochSource
	// Publisher is the region's publisher of the global epoch; nil in a
	// regional-only deployment, where versions carry local epochs.
	Publisher EpochSource
	// Service is the global epoch service itself, across the WAN: read only
	// by the naive commit baseline (nil if there is none).
	Service EpochSource
	// Near is the publisher of the replica's own region when that is not
	// the range's home (a non-voting replica, DESIGN.md §13): a follower
	// read there waits on it, not across the WAN. nil: Publisher.
	Near EpochSource
}

// Decider records transaction outcomes; txnstate.Client implements it.
type Decider interface {
	Decide(ctx context.Context, rec *txnstatepb.Record) (*txnstatepb.Record, error)
}

// Config tunes a range replica. Zero fields take the defaults noted.
type Config struct {
	// LeaseEpochs is how far ahead of the current local epoch a lease's end is
	// set when it is acquired or renewed (default 100, paper §2.3.1;
	// topology range_lease_epochs).
	LeaseEpochs uint64
	// LeaseRenewEpochs: the holder renews once fewer than this many epochs
	// of its lease remain, and a new leader queues its lease behind one
	// ending within this many (default LeaseEpochs/2; topology
	// range_lease_renew_epochs).
	LeaseRenewEpochs uint64
	// Tick is the period of the lease and resolver loop (default 10 ms).
	Tick time.Duration
	// EpochInterval is the local epoch's full-pace interval (topology
	// local_epoch_interval; default 10 ms): a leaseholder that reuses an
	// epoch read assumes the epoch may move this fast even if it only saw
	// the idle pace (epoch.Pace).
	EpochInterval time.Duration
	// OrphanAfter is how long a transaction may hold locks here, or stay
	// prepared without a decision, without a word from its coordinator (an
	// operation or a heartbeat) before the leader resolves it through the
	// transaction state store (default topology.DefaultOrphanAfter, DESIGN.md
	// §10). A transaction waiting for a lock here is never an orphan.
	OrphanAfter time.Duration
	// QuietEpochs is k of the paper's §5.3.1: no one-phase commit here takes a
	// global epoch that is a multiple of k (0: off).
	QuietEpochs uint64
	// Clock tells the leader the time for its orphan bound (default: the
	// system clock); tests inject their own.
	Clock Clock
	// SplitSize splits the range at its middle once its data takes this many
	// bytes on disk (0: never by size).
	SplitSize uint64
	// SplitQPS splits the range at the key that divides its load once it has
	// served more requests per second than this for loadSplitAfter (0: never
	// by load).
	SplitQPS float64
	// MergeSize merges the range with its right-hand neighbour once both
	// together take fewer bytes on disk than this (0: no automatic merges).
	MergeSize uint64
	// MergeQPS is the request rate per second both ranges together must stay
	// under to merge automatically (0: any).
	MergeQPS float64
	// MergeDelay is how long both ranges must have kept their shape (no
	// split or merge, no restart) before they merge automatically.
	MergeDelay time.Duration
	// GCTTL is how long a replaced version stays readable: the leader
	// collects versions below the epochs that were current GCTTL ago
	// (DESIGN.md §14). 0: never. Used when the home has no GC policy.
	GCTTL time.Duration
	// Sibling returns this node's replica of the range whose span starts at
	// key (nil: none here). Merges find the right-hand neighbour with it.
	Sibling func(key []byte) *Replica
	// PeerDescriptor returns node's descriptor of range id (nil, nil: the
	// node does not host it). A merge asks every replica of the subsumed
	// range whether it has applied its subsume.
	PeerDescriptor func(ctx context.Context, node, id uint64) (*pb.RangeDescriptor, error)
	// PeerTransferLease asks node's replica of range id, its leaseholder,
	// to hand the lease to node `to` (TransferLease, not if-idle). A change
	// of a range's replicas brings its mergeable right-hand neighbour's
	// lease to its own leader with it first (claimReplicaChange). nil: a
	// replica with no peers (unit tests), which skips that step.
	PeerTransferLease func(ctx context.Context, node, id, to uint64) error
	// ClosedInterval is the least time between two epochs the leader
	// closes (DESIGN.md §13; default topology.DefaultClosedEpochInterval,
	// negative: never, for tests). Each close of a busy range is one Raft
	// entry (an idle one's goes by SideClose); a changefeed's resolved
	// epoch trails the publisher by about this much.
	ClosedInterval time.Duration
	// Closes, if set, count the leader's closes: [0] through the log, [1]
	// by SideClose.
	Closes [2]prometheus.Counter
	// SideClose, if set, sends an idle range's close to the nodes
	// holding its other replicas, outside the log (SideTransport.Send;
	// sideclosed.go). nil: every close is a Raft entry.
	SideClose func(nodes []uint64, u *pb.SideClosed)
	// LockWait, if set, observes the seconds each lock acquisition spent in
	// the lock table (waiting behind other transactions' locks).
	LockWait prometheus.Observer
	// CommitStages, if set, observe the seconds a one-phase commit
	// (CommitOnePhase) spent in each stage at the range leader, indexed by
	// CommitStage: taking its locks (a one-shot's, waits included), reading
	// the epochs (and the write set's newest versions), and replicating its writes (proposal to applied; a commit
	// with writes only). Nil entries observe nothing.
	CommitStages [NumCommitStages]prometheus.Observer
	// EpochsReadAhead, if set, counts the one-phase commits that used the
	// epochs read ahead at their transaction's last Lock (readahead.go).
	EpochsReadAhead prometheus.Counter
	// ClosedLag, if set, observes the leader's closed-epoch lag each time
	// it begins a close (DESIGN.md §13): the publisher's epoch minus the
	// range's closed epoch, in epochs.
	ClosedLag prometheus.Observer
	// AddReplica asks node to host an empty replica of d, which names it
	// as a learner (DESIGN.md §12). nil: replica moves are refused.
	AddReplica func(ctx context.Context, node uint64, d *pb.RangeDescriptor) error
	// RemoveReplica asks node to drop its replica of range id, which the
	// range no longer names.
	RemoveReplica func(ctx context.Context, node, id uint64) error
	// Region is the region of this replica's node: a replica outside its
	// range's home takes no lease (empty: any region, for tests).
	Region string
	// HomeOf returns what a replica reads from region once a rehome moved
	// its range there (DESIGN.md §13). nil: rehomes are refused.
	HomeOf func(region string) (Home, error)
	// PickVoters returns the nodes of region a rehome of the range d
	// describes makes its voters, when the caller names none: live nodes,
	// its non-voters there first. nil: the caller must name them.
	PickVoters func(ctx context.Context, region string, d *pb.RangeDescriptor) ([]uint64, error)
	// Rehomed tells the directories of a rehome's new descriptor (DESIGN.md
	// §11); an error is logged (the reconciliation writes it later).
	Rehomed func(ctx context.Context, d *pb.RangeDescriptor) error
}

// Clock tells the time. The leader reads the time only through it, so its
// orphan logic can be driven by a test without sleeping.
type Clock interface {
	Now() time.Time
}

// systemClock is the real time.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (c Config) withDefaults() Config {
	if c.LeaseEpochs == 0 {
		c.LeaseEpochs = topology.DefaultRangeLeaseEpochs
	}
	if c.LeaseRenewEpochs == 0 || c.LeaseRenewEpochs >= c.LeaseEpochs {
		c.LeaseRenewEpochs = c.LeaseEpochs / 2
	}
	if c.Tick <= 0 {
		c.Tick = 10 * time.Millisecond
	}
	if c.EpochInterval <= 0 {
		c.EpochInterval = topology.DefaultLocalEpochInterval
	}
	if c.OrphanAfter <= 0 {
		c.OrphanAfter = topology.DefaultOrphanAfter
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.ClosedInterval == 0 {
		c.ClosedInterval = topology.DefaultClosedEpochInterval
	}
	return c
}

// Errors a replica returns; the server maps them to gRPC codes.
var (
	// ErrNotLeaseholder: this replica does not serve the range now.
	ErrNotLeaseholder = errors.New("rangeserver: not the leaseholder")
	// ErrLeaseNotActive: the replica holds a lease the epoch has not reached (or
	// has passed); retry shortly.
	ErrLeaseNotActive = errors.New("rangeserver: lease not active at the current epoch")
	// ErrConflict: wait-die chose this transaction to die; retry it.
	ErrConflict = errors.New("rangeserver: lock conflict with an older transaction")
	// ErrLocksLost: the transaction's locks are gone (the leaseholder changed, or
	// it sat idle past OrphanAfter); retry it.
	ErrLocksLost = errors.New("rangeserver: the transaction's locks were lost")
	// ErrLeaseValidation: the local epoch is outside the lease (paper §4.2).
	ErrLeaseValidation = errors.New("rangeserver: local epoch outside the lease")
	// ErrRangeMismatch: the request's keys are not all in this range's span:
	// the sender routed by a stale descriptor. The error is a
	// *MismatchError carrying the range's current descriptor; the request
	// did not execute.
	ErrRangeMismatch = errors.New("rangeserver: keys outside the range")
)

// MismatchError is ErrRangeMismatch with the range's current descriptor, which
// the server returns to the sender (DESIGN.md §11).
type MismatchError struct {
	// Desc is the range's current descriptor (shared: do not modify).
	Desc *pb.RangeDescriptor
	// Keys names what fell outside the span.
	Keys string
	// Start and End bound the keys asked for (a nil End: unbounded); the
	// server adds the descriptors it hosts there to its reply.
	Start, End []byte
}

func (e *MismatchError) Error() string {
	d := e.Desc
	if d.GetSubsumed() {
		return fmt.Sprintf("%v: range %d [%q, %q) merged into its left neighbour (generation %d)", ErrRangeMismatch, d.GetRangeId(), d.GetStartKey(), d.GetEndKey(), d.GetGeneration())
	}
	return fmt.Sprintf("%v: %s not in range %d [%q, %q) generation %d", ErrRangeMismatch, e.Keys, d.GetRangeId(), d.GetStartKey(), d.GetEndKey(), d.GetGeneration())
}

// Unwrap makes errors.Is(err, ErrRangeMismatch) hold.
func (e *MismatchError) Unwrap() error { return ErrRangeMismatch }

// MaxKeySize is the largest key a range accepts: 4 KiB.
const MaxKeySize = 4 << 10

// keyspaceEnd sorts after every key of at most MaxKeySize bytes: the lock-table
// end of a scan to the end of the key space.
var keyspaceEnd = bytes.Repeat([]byte{0xff}, MaxKeySize+1)

// maxVersion sorts above every stored version: reads "as of now".
var maxVersion = storage.VersionID{Epoch: ^uint64(0), Counter: ^uint32(0)}

// Replica is one node's replica of a range, and while it holds the lease, the
// range's leader.
type Replica struct {
	id       uint64 // the range's ID
	self     uint64
	group    *raftgroup.Group
	sm       *StateMachine
	home     atomic.Pointer[Home] // what the replica reads from the range's home region (home.go)
	deciders func(txnStateGroup uint64) Decider
	cfg      Config

	lastEpoch     atomic.Uint64 // the newest local epoch this replica has read
	epochRead     epochReading  // the tick's alone (tickEpoch)
	oneShots      oneShots      // IDs of the transactions sent whole that began here
	load          *loadTracker
	splits        splitQueue
	gcq           gcQueue
	reshaped      atomic.Int64 // Unix ns of the replica's start or its range's last split or merge
	closePaused   atomic.Bool  // PauseClosing
	rehoming      atomic.Bool  // finishRehome under way
	rehomeRetryAt atomic.Int64 // Unix ns before which finishRehome does not try again

	mu        sync.Mutex
	lead      *leadership            // nil unless serving as leaseholder
	inherited Inheritance            // from the range this one split from, on this node
	handoffs  map[uint64]Inheritance // by right-hand range ID: what splits of this range leave for it

	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the loop and the goroutines it starts, and those a request
	// starts through spawn; spawnMu orders spawn's Add against Close's
	// cancel, and so its Wait (an Add once Wait may have seen zero panics).
	wg      sync.WaitGroup
	spawnMu sync.Mutex
}

// NewReplica ties a range's state machine to its Raft group, reading from
// home, its range's home region (home.Region is the descriptor's). Start
// begins its loop.
//
// With a publisher in home, version ids carry global epochs (paper §5.1);
// without one they carry local epochs (a regional-only deployment).
func NewReplica(self uint64, group *raftgroup.Group, sm *StateMachine,
	home Home, deciders func(uint64) Decider, cfg Config) *Replica {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Replica{id: sm.Descriptor().GetRangeId(), self: self, group: group, sm: sm, deciders: deciders, cfg: cfg.withDefaults(), ctx: ctx, cancel: cancel}
	home.Region = sm.Descriptor().GetRegion()
	r.home.Store(&home)
	r.load = newLoadTracker(r.cfg.Clock.Now, r.cfg.SplitQPS)
	r.reshaped.Store(r.cfg.Clock.Now().UnixNano())
	sm.OnSplit(r.onSplit)
	sm.OnMerge(r.onMerge)
	return r
}

// Start begins the lease and resolver loop.
func (r *Replica) Start() {
	r.wg.Add(1)
	go r.loop()
}

// Close stops the loop, gives up leadership (waking lock waiters) and waits.
func (r *Replica) Close() {
	r.spawnMu.Lock()
	r.cancel()
	r.spawnMu.Unlock()
	r.wg.Wait()
	r.stepDown()
}

// spawn runs f on a goroutine that Close waits for, from a goroutine that
// is not one Close waits for (a request's). Once Close has begun, f does
// not run.
func (r *Replica) spawn(f func()) {
	r.spawnMu.Lock()
	defer r.spawnMu.Unlock()
	if r.ctx.Err() != nil {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// Desc returns the range's descriptor.
func (r *Replica) Desc() *pb.RangeDescriptor { return r.sm.Descriptor() }

// Status reports this replica's view of its range: descriptor, lease, whether
// it serves as leader, size on disk, and, at the leader, its request rate and
// locks.
func (r *Replica) Status() *pb.RangeStatus {
	st := &pb.RangeStatus{RangeDescriptor: r.sm.Descriptor(), Lease: r.sm.Lease(), Node: r.self, ClosedEpoch: r.sm.ClosedEpoch()}
	st.SizeBytes, _ = r.sm.Size()
	if l, err := r.leader(); err == nil {
		st.Leader, st.Qps, st.Locks = true, r.load.QPS(), uint32(l.txns.locks.Len())
		st.WritesByRegion = r.load.WriteRates()
	}
	return st
}

// Inheritance is what a split's right-hand range takes from the left-hand
// range's leader on the same node (DESIGN.md §11), under the lease that
// both halves hold: the left's highest epoch, and the records and locks of
// the transactions holding locks at or above the split key.
type Inheritance struct {
	leaseStart, highest uint64
	txns                []handedTxn
	set                 bool
}

// HandOver returns, once, what the right-hand range rightID of a split of
// this range inherits from this replica (see Inherit): set only if this
// replica led the range when the split applied.
func (r *Replica) HandOver(rightID uint64) Inheritance {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.handoffs[rightID]
	delete(r.handoffs, rightID)
	return in
}

// Inherit gives this replica, of a range a split just made, what the
// left-hand range's leader on this node handed over (HandOver). If it comes
// to lead under that same lease, it starts from the left's highest epoch
// instead of waiting for the global epoch to advance (invariant 5 holds:
// the split froze every commit on its keys, so no transaction released a
// lock on them above it), with the handed transactions' locks and
// incarnations; under any other lease those transactions find their locks
// lost.
func (r *Replica) Inherit(in Inheritance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inherited = in
}

// LeaseHolder returns the node named by the range's current lease (0: none).
func (r *Replica) LeaseHolder() uint64 { return r.sm.Lease().GetHolder() }

// LeadAtStart, as its node starts, has this replica stand for election
// until its group knows a leader (raftgroup.Group.LeadAtStart) if it is the
// one that should lead first: the lease holder, so that leadership and lease
// stay together, or, while no replica holds the lease, the group's
// StartLeader.
func (r *Replica) LeadAtStart() {
	first := r.sm.Lease().GetHolder()
	if first == 0 {
		first = r.group.StartLeader()
	}
	if first == r.self {
		r.group.LeadAtStart()
	}
}

// Campaign asks this replica to call an election now (the leaseholder's
// replica of a range a split just created).
func (r *Replica) Campaign() { r.group.Campaign() }

// ID returns the range's ID.
func (r *Replica) ID() uint64 { return r.id }

// LeaderHint returns the node this replica believes leads the range's Raft group.
func (r *Replica) LeaderHint() uint64 { return r.group.Status().Leader }

// Locks returns the number of locks the leader holds (0 when not leading).
func (r *Replica) Locks() int {
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.txns.locks.Len()
}

// HoldsLocks reports whether transaction txnID holds locks at this range:
// it is prepared in the replicated state, or this replica leads the range and
// tracks it in its lock table.
func (r *Replica) HoldsLocks(txnID []byte) bool {
	if r.sm.IsPrepared(txnID) {
		return true
	}
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	if l == nil {
		return false
	}
	return l.txns.holds(txnID)
}

// leader returns the serving leadership or why there is none.
func (r *Replica) leader() (*leadership, error) {
	r.mu.Lock()
	l := r.lead
	r.mu.Unlock()
	if l == nil || !r.group.IsLeader() {
		if d := r.sm.Descriptor(); d.GetSubsumed() {
			return nil, subsumedError(d)
		}
		return nil, ErrNotLeaseholder
	}
	if l.transferring.Load() {
		return nil, ErrNotLeaseholder // the lease is being handed over
	}
	if e := r.lastEpoch.Load(); e < l.start || e > l.end.Load() {
		return nil, ErrLeaseNotActive
	}
	return l, nil
}

// subsumedError is the *MismatchError of a subsumed range: it serves no key.
func subsumedError(d *pb.RangeDescriptor) *MismatchError {
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
	}
	return &MismatchError{Desc: d, Keys: "every key (merged into its left neighbour)", Start: d.GetStartKey(), End: end}
}

// checkKey refuses a key outside the range's span, or any key once the range
// is subsumed, with a *MismatchError.
func (r *Replica) checkKey(key []byte) error {
	d := r.sm.Descriptor()
	if d.GetSubsumed() {
		return subsumedError(d)
	}
	if bytes.Compare(key, d.GetStartKey()) < 0 || (len(d.GetEndKey()) > 0 && bytes.Compare(key, d.GetEndKey()) >= 0) {
		return &MismatchError{Desc: d, Keys: fmt.Sprintf("key %q", key), Start: key, End: append(append([]byte{}, key...), 0)}
	}
	return nil
}

// checkSpan refuses a span [start, end) (a nil end: to the end of the key
// space) that is not inside the range's span with a *MismatchError. A scan
// is never cut to the range silently: the sender's routing may be stale.
func (r *Replica) checkSpan(start, end []byte) error {
	d := r.sm.Descriptor()
	if d.GetSubsumed() {
		return subsumedError(d)
	}
	if bytes.Compare(start, d.GetStartKey()) >= 0 &&
		(len(d.GetEndKey()) == 0 || (end != nil && bytes.Compare(end, d.GetEndKey()) <= 0)) {
		return nil
	}
	return &MismatchError{Desc: d, Keys: fmt.Sprintf("span [%q, %q)", start, end), Start: start, End: end}
}

// checkGeneration refuses, with a *MismatchError, a request made under
// another generation of the range than its current one (gen 0: any): the
// range changed shape since the sender learned it, and what the sender
// tracked here may now be another range's (DESIGN.md §11). The reply
// carries every descriptor the node hosts from the range's start on.
func (r *Replica) checkGeneration(gen uint64) error {
	d := r.sm.Descriptor()
	if gen == 0 || gen == d.GetGeneration() {
		return nil
	}
	return &MismatchError{Desc: d, Keys: fmt.Sprintf("a request under generation %d", gen), Start: d.GetStartKey()}
}

// proposeTimeout bounds the wait for a proposal the caller may have given up
// on: its entry can still apply, so the leader keeps waiting for it.
const proposeTimeout = 5 * time.Second

// propose replicates a command and waits for it to apply, independently of the
// caller's context; a rejected command (its lease changed) is ErrLocksLost.
func (r *Replica) propose(ctx context.Context, cmd *pb.Command) error {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
	defer cancel()
	res, err := r.group.Propose(pctx, EncodeCommand(cmd))
	if err != nil {
		return err
	}
	if a, ok := res.(Applied); ok && a.Rejected {
		return fmt.Errorf("%w: the lease changed before the command applied", ErrLocksLost)
	}
	if err, ok := res.(error); ok {
		return err
	}
	return nil
}
