package rangeserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
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
	release, err := r.claimReplicaChange(ctx, l, ErrMoveBusy) // no split or merge meanwhile
	if err != nil {
		return nil, err
	}
	defer release()
	// Another move may have finished while this one waited for the claim.
	switch d = r.sm.Descriptor(); {
	case !slices.Contains(d.GetReplicas(), from):
		return nil, fmt.Errorf("%w: node %d is no longer a replica of range %d (replicas %v)", ErrMoveTarget, from, r.id, d.GetReplicas())
	case slices.Contains(d.GetReplicas(), to):
		return nil, fmt.Errorf("%w: node %d already hosts range %d (replicas %v)", ErrMoveTarget, to, r.id, d.GetReplicas())
	}
	steps := r.moveSteps(d.GetNonVoters())
	drop := steps.Drop
	steps.Drop = func(ctx context.Context, node uint64) error {
		err := drop(ctx, node)
		if err != nil && node == from {
			slog.Warn("moved replica not removed yet", "range", r.id, "node", from, "err", err)
		}
		return err
	}
	moved, err := r.changed(r.group.MoveReplica(ctx, from, to, steps))
	if err != nil {
		return nil, err
	}
	slog.Info("range replica moved", "range", r.id, "from", from, "to", to, "replicas", moved.GetReplicas(), "generation", moved.GetGeneration())
	return moved, nil
}

// changed maps the outcome of a configuration change the range proposed
// through raftgroup to the range's descriptor after it and its errors:
// ErrMoveTarget, ErrMoveBusy, ErrNotLeaseholder.
func (r *Replica) changed(res any, err error) (*pb.RangeDescriptor, error) {
	switch {
	case errors.Is(err, raftgroup.ErrMoveTarget):
		return nil, fmt.Errorf("%w: %w", ErrMoveTarget, err)
	case errors.Is(err, raftgroup.ErrMoveStuck), errors.Is(err, raftgroup.ErrHostFailed):
		return nil, fmt.Errorf("%w: %w", ErrMoveBusy, err)
	case errors.Is(err, raftgroup.ErrNotLeader):
		return nil, fmt.Errorf("%w: %v", ErrNotLeaseholder, err)
	case err != nil:
		return nil, err
	}
	d, ok := res.(*pb.RangeDescriptor)
	if !ok {
		return nil, fmt.Errorf("rangeserver: range %d configuration change: %v", r.id, res)
	}
	return d, nil
}

// moveSteps is what a configuration change of the range needs from it
// (raftgroup.MoveSteps), with nonVoters its non-voting replicas after the
// change: the learners among them are recorded as non-voters, the others
// as learners (a move's transient one), and the non-voters the change
// does not touch are kept.
func (r *Replica) moveSteps(nonVoters []uint64) raftgroup.MoveSteps {
	split := func(learners []uint64) (transient, kept []uint64) {
		for _, n := range learners {
			if slices.Contains(nonVoters, n) {
				kept = append(kept, n)
			} else {
				transient = append(transient, n)
			}
		}
		return transient, kept
	}
	return raftgroup.MoveSteps{
		Keep: slices.DeleteFunc(slices.Clone(r.sm.Descriptor().GetNonVoters()), func(n uint64) bool { return !slices.Contains(nonVoters, n) }),
		Payload: func(voters, learners []uint64) ([]byte, error) {
			transient, kept := split(learners)
			return proto.Marshal(&pb.ReplicasChange{Replicas: voters, Learners: transient, NonVoters: kept})
		},
		Host: func(ctx context.Context, node uint64, _, learners []uint64) error {
			d := proto.CloneOf(r.sm.Descriptor())
			d.Learners, d.NonVoters = split(learners)
			return r.cfg.AddReplica(ctx, node, d)
		},
		Drop: func(ctx context.Context, node uint64) error { return r.cfg.RemoveReplica(ctx, node, r.id) },
	}
}

// AddNonVoter adds a non-voting replica of the range on node, at the
// leaseholder (DESIGN.md §13): the node hosts an empty replica, joins the
// group as a learner that stays one, and catches up by a snapshot; it then
// serves snapshot reads from the closed epoch. Any node of any region may
// host one, but not one that hosts a voter or learner of the range; a node
// that is a non-voter already is no error (nothing changes). It returns
// the range's descriptor after. Errors: ErrMoveTarget, ErrMoveBusy (another
// change under way, or the replica did not catch up before ctx ended),
// ErrNotLeaseholder.
func (r *Replica) AddNonVoter(ctx context.Context, node uint64) (*pb.RangeDescriptor, error) {
	return r.changeNonVoter(ctx, node, true)
}

// RemoveNonVoter removes the range's non-voting replica on node, at the
// leaseholder, and asks the node to drop it. It returns the range's new
// descriptor. Errors: ErrMoveTarget (node hosts no non-voter of the
// range), ErrMoveBusy, ErrNotLeaseholder.
func (r *Replica) RemoveNonVoter(ctx context.Context, node uint64) (*pb.RangeDescriptor, error) {
	return r.changeNonVoter(ctx, node, false)
}

// changeNonVoter adds (add) or removes the non-voter on node, at the
// leaseholder, holding the range's move claim (no split, merge or other
// move meanwhile); the change is checked again once the claim is held.
func (r *Replica) changeNonVoter(ctx context.Context, node uint64, add bool) (*pb.RangeDescriptor, error) {
	check := func(d *pb.RangeDescriptor) (done bool, err error) {
		if add && slices.Contains(d.GetNonVoters(), node) {
			return true, nil // added already (a retry after an unknown outcome)
		}
		return false, r.checkNonVoterChange(d, node, add)
	}
	d := r.sm.Descriptor()
	if _, err := check(d); err != nil {
		return nil, err
	}
	l, err := r.leader()
	if err != nil {
		return nil, err
	}
	release, err := r.claimReplicaChange(ctx, l, ErrMoveBusy)
	if err != nil {
		return nil, err
	}
	defer release()
	d = r.sm.Descriptor()
	if done, err := check(d); done || err != nil {
		return d, err
	}
	change, verb := r.addNonVoterClaimed, "added"
	if !add {
		change, verb = r.removeNonVoterClaimed, "removed"
	}
	nd, err := change(ctx, node)
	if err != nil {
		return nil, err
	}
	slog.Info("range non-voting replica "+verb, "range", r.id, "node", node, "non_voters", nd.GetNonVoters(), "generation", nd.GetGeneration())
	return nd, nil
}

// addNonVoterClaimed adds the non-voter on node, its caller holding the
// range's move claim (changeNonVoter, Rehome).
func (r *Replica) addNonVoterClaimed(ctx context.Context, node uint64) (*pb.RangeDescriptor, error) {
	return r.changed(r.group.AddNonVoter(ctx, node, r.moveSteps(append(slices.Clone(r.sm.Descriptor().GetNonVoters()), node))))
}

// removeNonVoterClaimed removes the non-voter on node, its caller holding
// the range's move claim.
func (r *Replica) removeNonVoterClaimed(ctx context.Context, node uint64) (*pb.RangeDescriptor, error) {
	d := r.sm.Descriptor()
	steps := r.moveSteps(slices.DeleteFunc(slices.Clone(d.GetNonVoters()), func(n uint64) bool { return n == node }))
	steps.Keep = d.GetNonVoters() // the one to remove among them
	return r.changed(r.group.RemoveNonVoter(ctx, node, steps))
}

// checkNonVoterChange vets adding (add) or removing a non-voter on node.
func (r *Replica) checkNonVoterChange(d *pb.RangeDescriptor, node uint64, add bool) error {
	switch {
	case r.cfg.AddReplica == nil:
		return fmt.Errorf("%w: this node cannot change replicas", ErrMoveTarget)
	case d.GetSubsumed():
		return fmt.Errorf("%w: range %d is being merged away", ErrMoveBusy, r.id)
	case add && (node == 0 || named(d, node)):
		return fmt.Errorf("%w: node %d already hosts range %d (replicas %v, non-voters %v)", ErrMoveTarget, node, r.id, d.GetReplicas(), d.GetNonVoters())
	case !add && !slices.Contains(d.GetNonVoters(), node):
		return fmt.Errorf("%w: node %d hosts no non-voting replica of range %d (non-voters %v)", ErrMoveTarget, node, r.id, d.GetNonVoters())
	}
	return nil
}

// named reports whether d names node as a replica of any kind.
func named(d *pb.RangeDescriptor, node uint64) bool {
	return slices.Contains(d.GetReplicas(), node) || slices.Contains(d.GetLearners(), node) || slices.Contains(d.GetNonVoters(), node)
}

// RemoveLeftoverLearners removes, at the leaseholder, the range's learners
// while no move is under way (the move claim is free): moves cut short
// left them, and a node named as one can never be marked gone. It does
// nothing when the range has none, or another move or a split or merge
// holds the claim. Errors: ErrNotLeaseholder, raftgroup.ErrMoveStuck.
func (r *Replica) RemoveLeftoverLearners(ctx context.Context) error {
	if len(r.sm.Descriptor().GetLearners()) == 0 {
		return nil
	}
	l, err := r.leader()
	if err != nil {
		return err
	}
	release, ok := l.txns.claimMove()
	if !ok {
		return nil
	}
	defer release()
	return r.group.RemoveLearners(ctx, r.moveSteps(r.sm.Descriptor().GetNonVoters()))
}
