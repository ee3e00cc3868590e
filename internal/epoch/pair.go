package epoch

// Joint rounds (Reader.Pair): a range leader's commit reads its region's
// local epoch and publisher with one RPC per node asked (issue 17).

import (
	"context"
	"slices"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
)

// Pair makes the reads StartAll starts of this reader and partner together
// (a range leader's local epoch and its region's publisher: commit.go) run
// in joint rounds: a node asked for both groups gets one ReadEpochs RPC,
// and the two groups' first asks are led to the same nodes (issue 17: the
// publisher's read was an RPC per commit of its own). Each group's epoch
// is still decided by its own tally, from replies sent after its callers
// called (DESIGN.md §3.1): joining changes how many RPCs a read takes,
// never what it may return. The two readers must run on the same node
// (ServeLocally alike). Call it before the first Read; partner's own
// reads go on in their own rounds.
func (r *Reader) Pair(partner *Reader) { r.partner = partner }

// askJointly sends the first asks of a joint round (Pair): req to this
// group's replicas and preq to the partner's, the partner's remote ask
// led to a node this group asks too, one job per node carrying what it is
// asked. It returns what each group's first attempt (until) goes on from.
// The asks run in ctx, the round's: a reply for the partner must outlive
// this group's attempt.
func (r *Reader) askJointly(ctx context.Context, req, preq *epochpb.ReadEpochRequest) (mine, theirs *firstAsk) {
	p := r.partner
	mine = &firstAsk{known: r.knownConf(), replies: make(chan reply, 8)}
	theirs = &firstAsk{known: p.knownConf(), replies: make(chan reply, 8)}
	background := req.GetBackground()
	var ours, others []uint64
	ours, mine.all = r.plan(mine.known, background, r.preferred.Load())
	lead := p.preferred.Load()
	partnerVoters := theirs.known.members()
	for _, id := range ours {
		if id != r.self && slices.Contains(partnerVoters, id) {
			lead = id
			break
		}
	}
	others, theirs.all = p.plan(theirs.known, background, lead)
	for _, id := range append(slices.Clone(ours), others...) {
		if slices.Contains(mine.asked, id) || slices.Contains(theirs.asked, id) {
			continue // sent with the node's first job
		}
		j := askJob{ctx: ctx, node: id}
		if slices.Contains(ours, id) {
			mine.asked = append(mine.asked, id)
			j.parts = append(j.parts, askPart{req: req, replies: mine.replies, boot: r.boot})
		}
		if slices.Contains(others, id) {
			theirs.asked = append(theirs.asked, id)
			j.parts = append(j.parts, askPart{req: preq, replies: theirs.replies, boot: p.boot})
		}
		r.send(j)
	}
	return mine, theirs
}
