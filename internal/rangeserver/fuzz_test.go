package rangeserver

import (
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// FuzzRangeCommands: any log entry a range might be handed, and any spans a
// streamed snapshot might name, are judged without a panic.
func FuzzRangeCommands(f *testing.F) {
	e, err := storage.Open(f.TempDir(), 1)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	f.Add(EncodeCommand(&pb.Command{Cmd: &pb.Command_Lease{Lease: &pb.LeaseCmd{Lease: &pb.Lease{Holder: 1, Start: 1, End: 9, Seq: 1}}}}), []byte{})
	f.Add(EncodeCommand(&pb.Command{Cmd: &pb.Command_OnePhase{OnePhase: &pb.OnePhaseCmd{TxnId: make([]byte, 16),
		Writes: []*pb.Write{{Key: []byte("k"), Value: []byte("v")}}, Version: &pb.VersionID{Epoch: 3, Counter: 1},
		RegionalVersion: &pb.VersionID{Epoch: 9, Counter: 1}}}}), storage.AppendRecord(storage.AppendRecord(nil, []byte{1}), []byte{2}))
	f.Add([]byte{0xff, 0x01}, []byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, cmd, snap []byte) {
		sm, err := NewStateMachine(e, &pb.RangeDescriptor{RangeId: 10, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		b := e.NewIndexedBatch()
		defer b.Close()
		sm.Apply(b, 1, cmd)
		var spans [][2][]byte
		for len(snap) > 0 {
			lo, rest, err := storage.NextRecord(snap)
			if err != nil {
				break
			}
			hi, rest, err := storage.NextRecord(rest)
			if err != nil {
				break
			}
			spans, snap = append(spans, [2][]byte{lo, hi}), rest
		}
		_ = sm.CheckSpans(spans)
	})
}
