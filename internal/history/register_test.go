package history

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

func regOp(client int, call, ret int64, in RegisterInput, out RegisterOutput) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
}

func TestRegisterModel(t *testing.T) {
	const never = 1 << 62
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"write then read", []porcupine.Operation{
			regOp(1, 0, 10, RegisterInput{Key: 0, Kind: RegWrite, Value: 5}, RegisterOutput{}),
			regOp(2, 20, 30, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: 5}),
		}, true},
		{"stale read after an acknowledged write", []porcupine.Operation{
			regOp(1, 0, 10, RegisterInput{Key: 0, Kind: RegWrite, Value: 5}, RegisterOutput{}),
			regOp(2, 20, 30, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: Absent}),
		}, false},
		{"registers are independent", []porcupine.Operation{
			regOp(1, 0, 10, RegisterInput{Key: 0, Kind: RegWrite, Value: 5}, RegisterOutput{}),
			regOp(2, 20, 30, RegisterInput{Key: 1, Kind: RegRead}, RegisterOutput{Value: Absent}),
		}, true},
		{"cas that swapped", []porcupine.Operation{
			regOp(1, 0, 10, RegisterInput{Key: 0, Kind: RegWrite, Value: 5}, RegisterOutput{}),
			regOp(2, 20, 30, RegisterInput{Key: 0, Kind: RegCAS, Expected: 5, Value: 6}, RegisterOutput{OK: true}),
			regOp(1, 40, 50, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: 6}),
		}, true},
		{"cas that claims to swap a value it cannot hold", []porcupine.Operation{
			regOp(1, 0, 10, RegisterInput{Key: 0, Kind: RegWrite, Value: 5}, RegisterOutput{}),
			regOp(2, 20, 30, RegisterInput{Key: 0, Kind: RegCAS, Expected: 4, Value: 6}, RegisterOutput{OK: true}),
		}, false},
		{"unknown write seen later", []porcupine.Operation{
			regOp(1, 0, never, RegisterInput{Key: 0, Kind: RegWrite, Value: 5}, RegisterOutput{Unknown: true}),
			regOp(2, 20, 30, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: 5}),
			regOp(2, 40, 50, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: 5}),
		}, true},
		{"unknown write seen, then unseen", []porcupine.Operation{
			regOp(1, 0, never, RegisterInput{Key: 0, Kind: RegWrite, Value: 5}, RegisterOutput{Unknown: true}),
			regOp(2, 20, 30, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: 5}),
			regOp(2, 40, 50, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: Absent}),
		}, false},
		{"unknown cas never seen", []porcupine.Operation{
			regOp(1, 0, never, RegisterInput{Key: 0, Kind: RegCAS, Expected: Absent, Value: 7}, RegisterOutput{Unknown: true}),
			regOp(2, 20, 30, RegisterInput{Key: 0, Kind: RegRead}, RegisterOutput{Value: Absent}),
		}, true},
	} {
		if got := porcupine.CheckOperations(RegisterModel, tc.ops); got != tc.ok {
			t.Errorf("%s: porcupine says linearizable = %v, want %v", tc.name, got, tc.ok)
		}
	}
}
