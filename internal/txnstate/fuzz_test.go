package txnstate

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// FuzzTxnStateCommands: any log entry and any snapshot the transaction state
// store might be handed decode without a panic; a damaged snapshot is
// ErrCorrupt.
func FuzzTxnStateCommands(f *testing.F) {
	e, err := storage.Open(f.TempDir(), 1)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	abort := &txnstatepb.Record{TxnId: make([]byte, TxnIDLen), Outcome: txnstatepb.Outcome_OUTCOME_ABORTED, AbortRegion: "r", AbortBound: 9}
	rec, _ := proto.Marshal(abort)
	decide, _ := EncodeDecide(abort)
	forget, _ := EncodeForget([][]byte{make([]byte, TxnIDLen)})
	marks, _ := proto.Marshal(&txnstatepb.Watermarks{LocalEpochs: map[string]uint64{"r": 9}})
	f.Add(decide, storage.AppendRecord(storage.AppendRecord(nil, marks), rec))
	f.Add(forget, storage.AppendRecord(nil, marks))
	f.Add([]byte{0x0a, 0x03}, []byte{0, 0, 0, 4, 1})
	f.Fuzz(func(t *testing.T, cmd, snap []byte) {
		sm, err := NewStateMachine(e, 2)
		if err != nil {
			t.Fatal(err)
		}
		b := e.NewIndexedBatch()
		defer b.Close()
		sm.Apply(b, 1, cmd)
		if err := sm.Restore(b, snap); err != nil && !errors.Is(err, storage.ErrCorrupt) {
			t.Fatalf("restore of %x: %v, not ErrCorrupt", snap, err)
		}
	})
}
