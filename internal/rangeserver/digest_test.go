package rangeserver

import (
	"errors"
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// TestDataDigestComparesReplicas: two replicas that applied the same writes
// digest alike as of an epoch both closed, whatever each wrote after it; a
// replica missing a key, or holding another value, digests otherwise; an
// epoch not yet closed, or below the GC threshold, is not ready.
func TestDataDigestComparesReplicas(t *testing.T) {
	replica := func(node uint64, writes ...*pb.Command) *Replica {
		e, err := storage.Open(t.TempDir(), node)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		sm, _ := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, EndKey: []byte("m"), Region: "r", Generation: 3})
		apply(t, sm, leaseCmd(1, 1, 100, 1, 0))
		apply(t, sm, writes...)
		apply(t, sm, closedCmd(8, 1))
		sm.PostApply(0)
		return &Replica{id: 10, self: node, sm: sm}
	}
	digest := func(r *Replica, epoch uint64) (uint64, int) {
		t.Helper()
		sum, keys, gen, err := r.DataDigest(epoch)
		if err != nil || gen != 3 {
			t.Fatalf("digest on node %d: generation %d, %v", r.self, gen, err)
		}
		return sum, keys
	}
	a := replica(1, onePhase("a", 5, "apple", "1"), onePhase("b", 6, "banana", "2"), onePhase("c", 8, "cherry", "3"))
	b := replica(2, onePhase("a", 5, "apple", "1"), onePhase("b", 6, "banana", "2"), onePhase("c", 8, "cherry", "3"))
	lost := replica(3, onePhase("a", 5, "apple", "1"), onePhase("c", 8, "cherry", "3"))
	other := replica(4, onePhase("a", 5, "apple", "1"), onePhase("b", 6, "banana", "9"), onePhase("c", 8, "cherry", "3"))
	sa, ka := digest(a, 7)
	if sb, kb := digest(b, 7); sb != sa || kb != ka || ka != 2 {
		t.Fatalf("identical replicas as of epoch 7: %x (%d keys) and %x (%d keys); want equal, 2 keys", sa, ka, sb, kb)
	}
	if s, _ := digest(lost, 7); s == sa {
		t.Error("a replica missing banana digests as one holding it")
	}
	if s, _ := digest(other, 7); s == sa {
		t.Error("a replica with another value of banana digests alike")
	}
	if s, _ := digest(a, 8); s == sa {
		t.Error("epoch 8 (cherry written) digests as epoch 7")
	}
	if _, _, _, err := a.DataDigest(9); !errors.Is(err, ErrDigestNotReady) {
		t.Errorf("a digest as of epoch 9, above the closed 8 = %v; want ErrDigestNotReady", err)
	}
	apply(t, a.sm, gcCmd(8, 0, "", 0, false))
	a.sm.PostApply(0)
	if _, _, _, err := a.DataDigest(7); !errors.Is(err, ErrDigestNotReady) {
		t.Errorf("a digest as of epoch 7, below the GC threshold 8 = %v; want ErrDigestNotReady", err)
	}
}
