package rangeserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/transport"
)

// Errors of MoveReplica. ErrMoveTarget leaves the range as it was; after
// ErrMoveBusy the range's voters are as they were, though a learner may
// have come and gone (its generation shows it).
var (
	// ErrMoveTarget: the source is not a replica of the range, or the
	// target is not a node that could take one (it hosts the range already,
	// or could not be asked to: unknown, down, or in another region).
	ErrMoveTarget = errors.New("rangeserver: bad replica move")
	// ErrMoveBusy: another change of the range's shape or replicas is under
	// way, or the new replica did not catch up in time; retry later.
	ErrMoveBusy = errors.New("rangeserver: the range cannot move a replica now")
)

// catchUpPoll is how often a move checks whether its learner caught up.
const catchUpPoll = 10 * time.Millisecond

// MoveReplica moves the range's replica on node from to node to, run at
// the leaseholder (DESIGN.md §12): to hosts an empty replica and joins as a
// learner; it catches up by a snapshot (streamed from a consistent engine
// snapshot: no replica's log starts at its first entry, raftgroup); once it has, one joint
// configuration change promotes it and removes from, which Raft leaves by
// itself; finally from is told to drop its replica. The group keeps three
// voters throughout. Moving the leaseholder's own replica first hands the
// lease to another replica and fails with ErrNotLeaseholder, so the caller
// retries there. A learner that does not catch up before ctx ends is
// removed again. It returns the range's new descriptor.
func (r *Replica) MoveReplica(ctx context.Context, from, to uint64) (*pb.RangeDescriptor, error) {
	d := r.sm.Descriptor()
	switch {
	case r.cfg.AddReplica == nil:
		return nil, fmt.Errorf("%w: this node cannot move replicas", ErrMoveTarget)
	case !slices.Contains(d.GetReplicas(), from):
		return nil, fmt.Errorf("%w: node %d is not a replica of range %d (replicas %v)", ErrMoveTarget, from, r.id, d.GetReplicas())
	case to == 0 || slices.Contains(d.GetReplicas(), to):
		return nil, fmt.Errorf("%w: node %d already hosts range %d (replicas %v)", ErrMoveTarget, to, r.id, d.GetReplicas())
	case d.GetSubsumed():
		return nil, fmt.Errorf("%w: range %d is being merged away", ErrMoveBusy, r.id)
	}
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	if _, _, joint := r.group.Members(); joint {
		return nil, fmt.Errorf("%w: range %d is leaving a joint configuration", ErrMoveBusy, r.id)
	}
	if from == r.self {
		// A leaseholder moves its lease before it removes itself: to the
		// replica furthest along its log.
		_, match, _, err := r.group.Progress(ctx)
		if err != nil {
			return nil, err
		}
		var succ uint64
		for _, other := range d.GetReplicas() {
			if other != r.self && (succ == 0 || match[other] > match[succ]) {
				succ = other
			}
		}
		if _, err := r.TransferLease(ctx, succ, false); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: the lease moved to node %d before moving node %d's replica", ErrNotLeaseholder, succ, from)
	}
	release, ok := l.txns.claimMove() // no split or merge meanwhile
	if !ok {
		return nil, fmt.Errorf("%w: range %d is changing shape or moving a replica", ErrMoveBusy, r.id)
	}
	defer release()
	// Another move may have finished while this one waited for the claim.
	switch d = r.sm.Descriptor(); {
	case !slices.Contains(d.GetReplicas(), from):
		return nil, fmt.Errorf("%w: node %d is no longer a replica of range %d (replicas %v)", ErrMoveTarget, from, r.id, d.GetReplicas())
	case slices.Contains(d.GetReplicas(), to):
		return nil, fmt.Errorf("%w: node %d already hosts range %d (replicas %v)", ErrMoveTarget, to, r.id, d.GetReplicas())
	}
	if len(d.GetLearners()) > 0 {
		// A move cut short (its leader failed) left a learner: take it out
		// before anything else (under the claim: no other move is adding it).
		// One at a time: several at once would enter a joint configuration.
		learners := d.GetLearners()
		for i, n := range learners {
			if _, err := r.changeConf(ctx, d.GetReplicas(), learners[i+1:], single(raftpb.ConfChangeRemoveNode, n)); err != nil {
				return nil, fmt.Errorf("%w: removing the learner on node %d a failed move left: %v", ErrMoveBusy, n, err)
			}
			_ = r.cfg.RemoveReplica(ctx, n, r.id)
		}
		d = r.sm.Descriptor()
	}
	withLearner := proto.CloneOf(d)
	withLearner.Learners = []uint64{to}
	if err := r.cfg.AddReplica(ctx, to, withLearner); err != nil {
		return nil, fmt.Errorf("%w: node %d cannot host range %d: %v", ErrMoveTarget, to, r.id, err)
	}
	if _, err := r.changeConf(ctx, d.GetReplicas(), []uint64{to}, single(raftpb.ConfChangeAddLearnerNode, to)); err != nil {
		return nil, err
	}
	if err := r.awaitCatchUp(ctx, to); err != nil {
		// Take the learner out again (best effort: a later move finds it
		// in the descriptor and refuses until it is gone).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), proposeTimeout)
		defer cancel()
		if _, rerr := r.changeConf(rctx, d.GetReplicas(), nil, single(raftpb.ConfChangeRemoveNode, to)); rerr == nil {
			_ = r.cfg.RemoveReplica(rctx, to, r.id)
		}
		return nil, fmt.Errorf("%w: node %d's replica of range %d did not catch up: %v", ErrMoveBusy, to, r.id, err)
	}
	replicas := append(slices.DeleteFunc(slices.Clone(d.GetReplicas()), func(n uint64) bool { return n == from }), to)
	res, err := r.changeConf(ctx, replicas, nil,
		single(raftpb.ConfChangeAddNode, to),
		single(raftpb.ConfChangeRemoveNode, from))
	if err != nil {
		return nil, err
	}
	for { // Raft leaves the joint configuration by itself
		if _, _, joint := r.group.Members(); !joint {
			break
		}
		if !transport.SleepCtx(ctx, catchUpPoll) {
			return nil, ctx.Err()
		}
	}
	if err := r.cfg.RemoveReplica(ctx, from, r.id); err != nil {
		slog.Warn("moved replica not removed yet", "range", r.id, "node", from, "err", err)
	}
	slog.Info("range replica moved", "range", r.id, "from", from, "to", to, "replicas", res.GetReplicas(), "generation", res.GetGeneration())
	return res, nil
}

// changeConf proposes a configuration change whose descriptor names
// replicas and learners, and waits until it applies here.
func (r *Replica) changeConf(ctx context.Context, replicas, learners []uint64, changes ...*raftpb.ConfChangeSingle) (*pb.RangeDescriptor, error) {
	payload, err := proto.Marshal(&pb.ReplicasChange{Replicas: replicas, Learners: learners})
	if err != nil {
		return nil, err
	}
	cc := &raftpb.ConfChangeV2{Changes: changes}
	pctx, cancel := context.WithTimeout(ctx, proposeTimeout)
	defer cancel()
	res, err := r.group.ProposeConfChange(pctx, cc, payload)
	if err != nil {
		return nil, err
	}
	d, ok := res.(*pb.RangeDescriptor)
	if !ok {
		return nil, fmt.Errorf("rangeserver: range %d configuration change: %v", r.id, res)
	}
	return d, nil
}

// awaitCatchUp waits until replica node has every entry the leader had
// committed when the wait began.
func (r *Replica) awaitCatchUp(ctx context.Context, node uint64) error {
	var target uint64
	for {
		commit, match, ok, err := r.group.Progress(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return ErrNotLeaseholder
		}
		if target == 0 {
			target = commit
		}
		if match[node] >= target {
			return nil
		}
		if _, learners, _ := r.group.Members(); !slices.Contains(learners, node) {
			return fmt.Errorf("node %d is no longer a learner of range %d", node, r.id)
		}
		if !transport.SleepCtx(ctx, catchUpPoll) {
			return ctx.Err()
		}
	}
}

func single(t raftpb.ConfChangeType, node uint64) *raftpb.ConfChangeSingle {
	return &raftpb.ConfChangeSingle{Type: t.Enum(), NodeId: proto.Uint64(node)}
}
