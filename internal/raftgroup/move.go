package raftgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/transport"
)

// Replica moves (DESIGN.md §12), the same sequence for every kind of group:
// the target hosts an empty replica and joins as a learner, catches up from
// the leader's log or a snapshot, and one joint configuration change
// promotes it and removes the source, which Raft then leaves by itself;
// finally the source drops its replica. The group keeps its voters
// throughout. The owner of the group supplies what differs by kind
// (MoveSteps): the payload its state machine records with each change (a
// range's descriptor), and how a node is asked to host or drop a replica.

// Errors of MoveReplica. After ErrMoveStuck the group's voters are as they
// were; a learner may have come and gone.
var (
	// ErrMoveTarget: the source is not a voter, or the target is one
	// already.
	ErrMoveTarget = errors.New("raftgroup: bad replica move")
	// ErrHostFailed: the target did not answer the request to host a
	// replica (unreachable, busy); nothing was added, and the move may be
	// tried again.
	ErrHostFailed = errors.New("raftgroup: the target could not host the replica")
	// ErrMoveStuck: the group is in a joint configuration, or the learner
	// did not catch up before ctx ended or left the group; retry later.
	ErrMoveStuck = errors.New("raftgroup: the replica move did not complete")
)

// MoveSteps is what a replica move needs from the group's owner.
type MoveSteps struct {
	// Payload returns what the change to a configuration with voters and
	// learners is proposed with (a ConfChanger's payload); nil for none.
	Payload func(voters, learners []uint64) ([]byte, error)
	// Host asks node to host an empty replica of the group, which joins as
	// a learner with learners as the group's learners. An error wrapping
	// ErrMoveTarget refuses the move (the node cannot take replicas);
	// others are passed on as they are (the move may be tried again).
	Host func(ctx context.Context, node uint64, voters, learners []uint64) error
	// Drop asks node to drop its replica, which the group no longer names.
	// Best effort: a node drops a replica by itself when it applies a
	// configuration that leaves it out.
	Drop func(ctx context.Context, node uint64) error
	// Keep lists the learners meant to stay: a range's non-voting replicas
	// (DESIGN.md §13). No move removes them as leftovers, and every change
	// keeps them.
	Keep []uint64
}

// leftovers returns the learners a move cut short left behind: those not
// kept.
func (s MoveSteps) leftovers(learners []uint64) []uint64 {
	return slices.DeleteFunc(slices.Clone(learners), func(n uint64) bool { return slices.Contains(s.Keep, n) })
}

// kept returns the kept learners plus extra.
func (s MoveSteps) kept(extra ...uint64) []uint64 {
	return append(slices.Clone(s.Keep), extra...)
}

// movePoll is how often a move checks its learner's progress and whether
// Raft left the joint configuration.
const movePoll = 10 * time.Millisecond

// catchUpBeforePromotion bounds StepVoters' wait for a learner to catch
// up before it promotes it.
const catchUpBeforePromotion = 2 * time.Second

// changeTimeout bounds one configuration change's proposal.
const changeTimeout = 5 * time.Second

// RemoveLearners removes, on the leader, the group's learners, one at a
// time: with no move under way (the caller's to know), they are what moves
// cut short left behind, and their nodes could never be drained. steps
// gives the changes' payload and drops each learner's replica (best
// effort). Errors: ErrMoveStuck, ErrNotLeader.
func (g *Group) RemoveLearners(ctx context.Context, steps MoveSteps) error {
	voters, learners, joint := g.Members()
	learners = steps.leftovers(learners)
	switch {
	case len(learners) == 0:
		return nil
	case joint:
		return fmt.Errorf("%w: group %d is leaving a joint configuration", ErrMoveStuck, g.id)
	case !g.IsLeader():
		return ErrNotLeader
	}
	return g.removeLearners(ctx, steps, voters, learners)
}

func (g *Group) removeLearners(ctx context.Context, steps MoveSteps, voters, learners []uint64) error {
	learners = steps.leftovers(learners)
	for i, n := range learners {
		if _, err := g.changeVoters(ctx, steps, voters, steps.kept(learners[i+1:]...), confChange(raftpb.ConfChangeRemoveNode, n)); err != nil {
			return fmt.Errorf("%w: removing the learner on node %d a failed move left: %v", ErrMoveStuck, n, err)
		}
		if steps.Drop != nil {
			_ = steps.Drop(ctx, n)
		}
		slog.Info("leftover learner removed", "group", g.id, "node", n)
	}
	return nil
}

// MoveReplica moves the group's voter on node from to node to; it runs at
// the leader, which must not be from (move leadership first). Learners a
// move cut short left behind are removed first, one at a time. It returns
// the state machine's result of the last change it proposed (nil for a
// group that is not a ConfChanger). Errors: ErrMoveTarget, ErrMoveStuck,
// ErrNotLeader, ctx's error, or those of the steps.
func (g *Group) MoveReplica(ctx context.Context, from, to uint64, steps MoveSteps) (any, error) {
	voters, learners, joint := g.Members()
	switch {
	case !slices.Contains(voters, from):
		return nil, fmt.Errorf("%w: node %d is not a voter of group %d (voters %v)", ErrMoveTarget, from, g.id, voters)
	case to == 0 || slices.Contains(voters, to):
		return nil, fmt.Errorf("%w: node %d is a voter of group %d already (voters %v)", ErrMoveTarget, to, g.id, voters)
	case slices.Contains(steps.Keep, to):
		return nil, fmt.Errorf("%w: node %d is a non-voting replica of group %d", ErrMoveTarget, to, g.id)
	case from == g.self:
		return nil, fmt.Errorf("%w: the leader of group %d cannot move its own replica", ErrMoveTarget, g.id)
	case joint:
		return nil, fmt.Errorf("%w: group %d is leaving a joint configuration", ErrMoveStuck, g.id)
	case !g.IsLeader():
		return nil, ErrNotLeader
	}
	if err := g.removeLearners(ctx, steps, voters, learners); err != nil {
		return nil, err
	}
	if _, err := g.addLearner(ctx, to, voters, steps); err != nil {
		return nil, err
	}
	next := append(slices.DeleteFunc(slices.Clone(voters), func(n uint64) bool { return n == from }), to)
	res, err := g.changeVoters(ctx, steps, next, steps.kept(),
		confChange(raftpb.ConfChangeAddNode, to), confChange(raftpb.ConfChangeRemoveNode, from))
	if err != nil {
		return nil, err
	}
	if err := g.awaitLeftJoint(ctx); err != nil {
		return nil, err
	}
	if steps.Drop != nil {
		_ = steps.Drop(ctx, from)
	}
	return res, nil
}

// addLearner has node `to` host a replica, adds it as a learner beside the
// kept ones, and waits until it has caught up; a learner that does not is
// taken out again. It returns the state machine's result of the change
// that added it.
func (g *Group) addLearner(ctx context.Context, to uint64, voters []uint64, steps MoveSteps) (any, error) {
	if err := steps.Host(ctx, to, voters, steps.kept(to)); err != nil {
		if errors.Is(err, ErrMoveTarget) {
			return nil, fmt.Errorf("node %d cannot host group %d: %w", to, g.id, err)
		}
		return nil, fmt.Errorf("%w: node %d cannot host group %d now: %w", ErrHostFailed, to, g.id, err)
	}
	res, err := g.changeVoters(ctx, steps, voters, steps.kept(to), confChange(raftpb.ConfChangeAddLearnerNode, to))
	if err != nil {
		if steps.Drop != nil && !errors.Is(err, ErrOutcomeUnknown) { // the empty replica hosted for nothing
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), changeTimeout)
			defer cancel()
			_ = steps.Drop(dctx, to)
		}
		return nil, err
	}
	if err := g.awaitCatchUp(ctx, to); err != nil {
		// Take the learner out again (best effort: a later move finds it
		// and removes it first).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), changeTimeout)
		defer cancel()
		if _, rerr := g.changeVoters(rctx, steps, voters, steps.kept(), confChange(raftpb.ConfChangeRemoveNode, to)); rerr == nil && steps.Drop != nil {
			_ = steps.Drop(rctx, to)
		}
		return nil, fmt.Errorf("%w: node %d's replica of group %d did not catch up: %v", ErrMoveStuck, to, g.id, err)
	}
	return res, nil
}

// AddNonVoter adds a learner on node `to` that stays one (a range's
// non-voting replica, DESIGN.md §13), at the leader: the node hosts an
// empty replica, joins as a learner beside steps.Keep, and catches up
// from the log or a snapshot. Leftover learners are removed first. It
// returns the state machine's result of the change that added it.
// Errors: ErrMoveTarget (to is a member already), ErrHostFailed,
// ErrMoveStuck (a joint configuration, or it did not catch up before ctx
// ended: it is taken out again), ErrNotLeader.
func (g *Group) AddNonVoter(ctx context.Context, to uint64, steps MoveSteps) (any, error) {
	voters, learners, joint := g.Members()
	switch {
	case to == 0 || slices.Contains(voters, to) || slices.Contains(steps.Keep, to):
		return nil, fmt.Errorf("%w: node %d is a member of group %d already (voters %v, non-voters %v)", ErrMoveTarget, to, g.id, voters, steps.Keep)
	case joint:
		return nil, fmt.Errorf("%w: group %d is leaving a joint configuration", ErrMoveStuck, g.id)
	case !g.IsLeader():
		return nil, ErrNotLeader
	}
	if err := g.removeLearners(ctx, steps, voters, learners); err != nil {
		return nil, err
	}
	return g.addLearner(ctx, to, voters, steps)
}

// RemoveNonVoter removes the kept learner on node, at the leader, and asks
// the node to drop its replica (best effort). It returns the state
// machine's result of the change. Errors: ErrMoveTarget (node is not one
// of steps.Keep), ErrMoveStuck (a joint configuration), ErrNotLeader.
func (g *Group) RemoveNonVoter(ctx context.Context, node uint64, steps MoveSteps) (any, error) {
	voters, _, joint := g.Members()
	switch {
	case !slices.Contains(steps.Keep, node):
		return nil, fmt.Errorf("%w: node %d is not a non-voting replica of group %d (non-voters %v)", ErrMoveTarget, node, g.id, steps.Keep)
	case joint:
		return nil, fmt.Errorf("%w: group %d is leaving a joint configuration", ErrMoveStuck, g.id)
	case !g.IsLeader():
		return nil, ErrNotLeader
	}
	rest := slices.DeleteFunc(steps.kept(), func(n uint64) bool { return n == node })
	res, err := g.changeVoters(ctx, steps, voters, rest, confChange(raftpb.ConfChangeRemoveNode, node))
	if err != nil {
		return nil, err
	}
	if steps.Drop != nil {
		_ = steps.Drop(ctx, node)
	}
	return res, nil
}

// changeVoters proposes a configuration change to voters and learners,
// with the owner's payload for it, and waits until it applies here.
func (g *Group) changeVoters(ctx context.Context, steps MoveSteps, voters, learners []uint64, changes ...*raftpb.ConfChangeSingle) (any, error) {
	var payload []byte
	if steps.Payload != nil {
		var err error
		if payload, err = steps.Payload(voters, learners); err != nil {
			return nil, err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, changeTimeout)
	defer cancel()
	res, err := g.ProposeConfChange(pctx, &raftpb.ConfChangeV2{Changes: changes}, payload)
	if err != nil {
		return nil, err
	}
	if err, ok := res.(error); ok {
		return nil, err
	}
	return res, nil
}

// awaitLeftJoint waits until this replica applied the end of a joint
// configuration, which Raft proposes by itself. Errors: ctx's.
func (g *Group) awaitLeftJoint(ctx context.Context) error {
	for {
		if _, _, joint := g.Members(); !joint {
			return nil
		}
		if !transport.SleepCtx(ctx, movePoll) {
			return ctx.Err()
		}
	}
}

// awaitCatchUp waits until node's replica has every entry the leader had
// committed when the wait began.
func (g *Group) awaitCatchUp(ctx context.Context, node uint64) error {
	var target uint64
	for {
		commit, match, ok, err := g.Progress(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return ErrNotLeader
		}
		if target == 0 {
			target = commit
		}
		if match[node] >= target {
			return nil
		}
		if _, learners, _ := g.Members(); !slices.Contains(learners, node) {
			return fmt.Errorf("node %d is no longer a learner of group %d", node, g.id)
		}
		if !transport.SleepCtx(ctx, movePoll) {
			return ctx.Err()
		}
	}
}

func confChange(t raftpb.ConfChangeType, node uint64) *raftpb.ConfChangeSingle {
	return &raftpb.ConfChangeSingle{Type: t.Enum(), NodeId: proto.Uint64(node)}
}

// StepVoters takes one step toward making `to` the group's voters, at the
// leader (a range's rehome, DESIGN.md §13): one joint configuration change
// promotes one node of `to` (hosting it and catching it up as a learner
// first if it is not one) and removes one voter not in `to`. The voter
// sets before and after share all but one node, so those common to both
// carry the change through whatever fails. When the leader itself is the
// only voter left to remove, it hands leadership to the voter of `to`
// furthest along its log and fails with ErrNotLeader: that voter takes the
// next step. It reports done once the voters are `to`. The learners of
// `to` not yet promoted must be among steps.Keep, so every change names
// them. Errors: ErrMoveTarget (to is empty), ErrMoveStuck (a joint
// configuration), ErrHostFailed, ErrNotLeader, ctx's error.
func (g *Group) StepVoters(ctx context.Context, to []uint64, steps MoveSteps) (res any, done bool, err error) {
	voters, learners, joint := g.Members()
	switch {
	case len(to) == 0:
		return nil, false, fmt.Errorf("%w: no voters to move group %d to", ErrMoveTarget, g.id)
	case joint:
		return nil, false, fmt.Errorf("%w: group %d is leaving a joint configuration", ErrMoveStuck, g.id)
	case !g.IsLeader():
		return nil, false, ErrNotLeader
	}
	var add, remove uint64
	for _, n := range to {
		if !slices.Contains(voters, n) {
			add = n
			break
		}
	}
	for _, n := range voters {
		if !slices.Contains(to, n) && n != g.self {
			remove = n
			break
		}
	}
	staying := slices.DeleteFunc(slices.Clone(voters), func(n uint64) bool { return !slices.Contains(to, n) })
	if remove == 0 && !slices.Contains(to, g.self) && len(staying) > 0 {
		// Hand leadership to a voter that answers, the furthest along;
		// among equals (no lease: no entries) any, so a retry after a
		// failed hand-off tries another.
		_, match, _, err := g.Progress(ctx)
		if err != nil {
			return nil, false, err
		}
		active, err := g.RecentlyActive(ctx)
		if err != nil {
			return nil, false, err
		}
		var best []uint64
		for _, n := range staying {
			switch {
			case !active[n]:
			case len(best) == 0 || match[n] > match[best[0]]:
				best = []uint64{n}
			case match[n] == match[best[0]]:
				best = append(best, n)
			}
		}
		if len(best) == 0 {
			// None answered since the leader's last quorum check (messages
			// dropped, or one check just reset them): any, at random, so
			// a retry tries another.
			best = staying
		}
		to := best[rand.IntN(len(best))]
		g.TransferLeadership(to)
		return nil, false, fmt.Errorf("%w: group %d: leadership handed to node %d, which removes this voter", ErrNotLeader, g.id, to)
	}
	if add == 0 && remove == 0 {
		return nil, true, nil
	}
	next := slices.Clone(voters)
	var changes []*raftpb.ConfChangeSingle
	if add != 0 {
		if !slices.Contains(learners, add) {
			if _, err := g.addLearner(ctx, add, voters, steps); err != nil {
				return nil, false, err
			}
		}
		// Only a learner that answers and has caught up becomes a voter, so
		// every configuration on the way keeps a quorum that is up.
		cctx, cancel := context.WithTimeout(ctx, catchUpBeforePromotion)
		err := g.awaitCatchUp(cctx, add)
		cancel()
		if active, aerr := g.RecentlyActive(ctx); err != nil || aerr != nil || !active[add] {
			return nil, false, fmt.Errorf("%w: group %d: node %d is not caught up and answering (%v, %v)", ErrMoveStuck, g.id, add, err, aerr)
		}
		changes, next = append(changes, confChange(raftpb.ConfChangeAddNode, add)), append(next, add)
	}
	if remove != 0 {
		changes = append(changes, confChange(raftpb.ConfChangeRemoveNode, remove))
		next = slices.DeleteFunc(next, func(n uint64) bool { return n == remove })
	}
	rest := slices.DeleteFunc(steps.kept(), func(n uint64) bool { return n == add })
	if res, err = g.changeVoters(ctx, steps, next, rest, changes...); err != nil {
		return nil, false, err
	}
	if err := g.awaitLeftJoint(ctx); err != nil {
		return nil, false, err
	}
	if remove != 0 && steps.Drop != nil {
		_ = steps.Drop(ctx, remove)
	}
	return res, len(next) == len(to) && !slices.ContainsFunc(next, func(n uint64) bool { return !slices.Contains(to, n) }), nil
}
