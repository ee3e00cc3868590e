package nemesis

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/topology"
)

// rehomeTimeout bounds one rehome the campaign asks for: non-voters
// caught up across the WAN, the lease ended, the voters moved.
const rehomeTimeout = 30 * time.Second

// rehomeRange moves a random range's home to another data region
// (DESIGN.md §13) while the load runs: transactions across it commit or
// abort cleanly, and the new home's snapshots see the state at the
// barrier. A placement rule over its keys has the replicate queue move it
// back. A refusal (too few live nodes there, another change under way) or
// a retryable failure is no anomaly.
func (cp *campaign) rehomeRange(ctx context.Context, r *rand.Rand, db *client.DB, ranges []topology.Group) bool {
	d := cp.rangeOf(insideRange([]byte(ranges[r.IntN(len(ranges))].Start)))
	if d == nil {
		return false
	}
	var others []string
	for _, region := range cp.regions {
		if region != d.GetRegion() {
			others = append(others, region)
		}
	}
	if len(others) == 0 {
		return false
	}
	to := others[r.IntN(len(others))]
	actx, cancel := context.WithTimeout(ctx, rehomeTimeout)
	defer cancel()
	_, _, err := db.AdminRehome(actx, insideRange(d.GetStartKey()), to)
	switch {
	case err == nil:
		cp.count("range rehomed")
		return true
	case errors.Is(err, client.ErrRehomeTarget), client.IsRetryable(err), errors.Is(err, client.ErrCommitUnknown),
		errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
		cp.count("rehome refused or cut short")
	default:
		cp.anomaly("rehoming range %d from %s to %s: %v", d.GetRangeId(), d.GetRegion(), to, err)
	}
	return false
}
