package rangeserver

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/raftgroup"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// TestAStoppingNodesEpochReadIsNotExecuted: a read or commit that meets
// its node's epoch reader closed (the node is stopping) reaches the client
// as not executed, with no leader hint, so the client asks another replica
// rather than failing the transaction (CI once saw "code = Internal desc =
// epoch: reader closed" when a chaos test killed a range's leader).
func TestAStoppingNodesEpochReadIsNotExecuted(t *testing.T) {
	r := &Replica{self: 3}
	st := status.Convert(r.toStatus(fmt.Errorf("snapshot read: %w", epoch.ErrReaderClosed)))
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("a closed epoch reader maps to %v (%s), want FailedPrecondition", st.Code(), st.Message())
	}
	var hint *pb.NotLeader
	for _, d := range st.Details() {
		if nl, ok := d.(*pb.NotLeader); ok {
			hint = nl
		}
	}
	if hint == nil || hint.GetLeaderHint() != 0 {
		t.Fatalf("details %v, want a NotLeader without a hint", st.Details())
	}
	// An error that also says a proposal may still apply keeps saying so.
	both := errors.Join(raftgroup.ErrStopped, epoch.ErrReaderClosed)
	if got := status.Code(r.toStatus(both)); got != codes.Unknown {
		t.Fatalf("a stopped proposal joined with a closed reader maps to %v, want Unknown", got)
	}
}
