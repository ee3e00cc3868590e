package transport

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// Finding a group whose replicas moved (DESIGN.md §12). A client starts
// from the replicas the topology names; once a group's replicas have moved
// (membership changes), none of those may host it any longer. Every node
// answers Transport/Group with its replica's view of a group's
// configuration; the newest view among the nodes of the group's region
// names its voters and, usually, its leader.

// locateTimeout bounds one Transport/Group call.
const locateTimeout = 500 * time.Millisecond

// GroupView is a group's configuration as the newest answer showed it.
type GroupView struct {
	// ConfIndex is the log index of the change that made it (0: the
	// bootstrap configuration).
	ConfIndex uint64
	// Voters are its voters, both halves of a joint one, each once.
	Voters []uint64
	// Leader is the leader a replica with this configuration knows of (0:
	// none).
	Leader uint64
	// Joint: a joint configuration (a move between its two halves).
	Joint bool
	// Learners are its learners (a move's target catching up).
	Learners []uint64
}

// LocateGroup asks every candidate node, in parallel, for its view of
// group's configuration and returns the newest. Errors: ErrNoLeader when
// no candidate hosts the group (or none answered before ctx ended).
func LocateGroup(ctx context.Context, d *Dialer, group uint64, candidates []uint64) (GroupView, error) {
	type answer struct {
		resp *transportpb.GroupResponse
		err  error
	}
	answers := make(chan answer, len(candidates))
	for _, id := range candidates {
		go func() {
			conn, err := d.Conn(id)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			cctx, cancel := context.WithTimeout(ctx, locateTimeout)
			defer cancel()
			resp, err := transportpb.NewTransportClient(conn).Group(cctx, &transportpb.GroupRequest{GroupId: group})
			answers <- answer{resp, err}
		}()
	}
	var best *transportpb.GroupResponse
	var lastErr error
	for range candidates {
		a := <-answers
		switch {
		case a.err != nil:
			lastErr = a.err
		case !a.resp.GetHosted():
		case best == nil || a.resp.GetConfIndex() > best.GetConfIndex() ||
			(a.resp.GetConfIndex() == best.GetConfIndex() && best.GetLeader() == 0):
			best = a.resp
		}
	}
	if best == nil {
		return GroupView{}, fmt.Errorf("%w: no node of %v hosts group %d (last error: %v)", ErrNoLeader, candidates, group, lastErr)
	}
	v := GroupView{ConfIndex: best.GetConfIndex(), Leader: best.GetLeader(), Voters: slices.Clone(best.GetVoters()),
		Joint: len(best.GetVotersOutgoing()) > 0, Learners: slices.Clone(best.GetLearners())}
	for _, id := range best.GetVotersOutgoing() {
		if !slices.Contains(v.Voters, id) {
			v.Voters = append(v.Voters, id)
		}
	}
	return v, nil
}

// RegionNodes returns the nodes of region the dialer's network book knows,
// with extra (node IDs) first, each once.
func (d *Dialer) RegionNodes(region string, extra []uint64) []uint64 {
	out := slices.Clone(extra)
	for _, n := range d.net.Nodes() {
		if n.Region == region && !slices.Contains(out, n.ID) {
			out = append(out, n.ID)
		}
	}
	return out
}
