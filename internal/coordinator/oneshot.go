package coordinator

import (
	"context"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// OneShot is the outcome of a single-key transaction run by
// Coordinator.OneShot.
type OneShot struct {
	// Value and Found are what a read found (a write reads nothing).
	Value []byte
	Found bool
	// Version is a write's version (zero for a read).
	Version storage.VersionID
	// Priority is the transaction's wait-die priority: pass it to the retry,
	// so that the retry keeps its age.
	Priority uint64
}

// OneShot runs a transaction that reads key (w nil) or writes w (key is
// then w's), in one round trip to the key's range leader: the request
// carries the whole transaction, and the leader takes its lock, reads, reads
// the local epoch, validates its lease and commits in one phase (DESIGN.md
// §4, invariant 4 held at the leader; issue 17). priority 0 starts a new
// transaction. Errors: as Txn.Get, Txn.Put and Txn.Commit (ErrConflict and
// other retryable errors mean nothing was written; ErrCommitUnknown, for a
// write, that the outcome is unknown, as when the leader saw a copy of the
// request first). The returned Priority is set on errors too.
func (c *Coordinator) OneShot(ctx context.Context, priority uint64, key []byte, w *pb.Write) (OneShot, error) {
	if w != nil {
		key = w.GetKey()
	}
	if err := CheckKey(key); err != nil {
		return OneShot{}, err
	}
	if w != nil {
		if err := CheckValue(w.GetValue()); err != nil {
			return OneShot{}, err
		}
		if err := c.checkPlacement(key); err != nil {
			return OneShot{}, err
		}
	}
	if priority == 0 {
		priority = c.priority()
	}
	out := OneShot{Priority: priority}
	req := &pb.OnePhaseRequest{MinEpoch: c.session.Load(), TakeLocks: true}
	if w != nil {
		req.Writes = []*pb.Write{w}
	} else {
		req.Reads = [][]byte{key}
	}
	err := c.routeKey(ctx, key, c.local, func(g *pb.RangeDescriptor) error {
		req.RangeId, req.Generation = g.GetRangeId(), g.GetGeneration()
		// A read writes nothing: asking again is safe whatever happened. A
		// request that fails leaves no lock behind: the leader releases
		// what it took unless the commit's outcome is unknown.
		return c.rangeCall(ctx, g, w == nil, func(ctx context.Context, rc pb.RangeClient) error {
			// Every attempt is a transaction of its own ID, of the same
			// age: a leader runs an ID once (a late copy of an earlier
			// attempt is refused, rangeserver.ErrDuplicate).
			req.Txn = c.newMeta(priority)
			resp, err := rc.CommitOnePhase(ctx, req)
			if err == nil {
				ver := resp.GetVersion()
				out.Version = storage.VersionID{Epoch: ver.GetEpoch(), Counter: ver.GetCounter()}
				if r := resp.GetReads(); len(r) == 1 {
					out.Value, out.Found = r[0].GetValue(), r[0].GetFound()
				}
			}
			return err
		})
	})
	if err != nil {
		return OneShot{Priority: priority}, err
	}
	c.raiseSession(out.Version.Epoch)
	if w == nil {
		out.Version = storage.VersionID{}
	}
	return out, nil
}
