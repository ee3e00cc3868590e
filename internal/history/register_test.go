package history

import (
	"fmt"
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

// TestRegisterWitnesses: each kind of anomaly is named with the operations
// that show it, every history it names is one porcupine rejects, and legal
// histories (concurrent writes read either way, an unknown write seen or
// not) get no witness.
func TestRegisterWitnesses(t *testing.T) {
	const never = 1 << 62
	w := func(c int, call, ret int64, k, v int) porcupine.Operation {
		return regOp(c, call, ret, RegisterInput{Key: k, Kind: RegWrite, Value: v}, RegisterOutput{Unknown: ret == never})
	}
	r := func(c int, call, ret int64, k, v int) porcupine.Operation {
		return regOp(c, call, ret, RegisterInput{Key: k, Kind: RegRead}, RegisterOutput{Value: v})
	}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want string // the witness, "" for none
	}{
		{"concurrent writes read either way", []porcupine.Operation{w(1, 0, 10, 0, 5), w(2, 5, 15, 0, 6), r(3, 20, 30, 0, 5), r(4, 20, 30, 0, 5)}, ""},
		{"an unknown write seen", []porcupine.Operation{w(1, 0, 10, 0, 5), w(2, 12, never, 0, 6), r(3, 20, 30, 0, 6)}, ""},
		{"an unknown write unseen", []porcupine.Operation{w(1, 0, 10, 0, 5), w(2, 12, never, 0, 6), r(3, 20, 30, 0, 5)}, ""},
		{"a value nobody wrote", []porcupine.Operation{w(1, 0, 10, 0, 5), r(3, 20, 30, 0, 7)},
			"op 1 read 7, which no recorded write wrote (a write reported failed took effect?)"},
		{"another register's value", []porcupine.Operation{w(1, 0, 10, 1, 5), r(3, 20, 30, 0, 5)},
			"op 1 read 5, which op 0 wrote to register 1"},
		{"a read from the future", []porcupine.Operation{r(3, 0, 10, 0, 5), w(1, 20, 30, 0, 5)},
			"op 0 read 5, which op 1 wrote only after the read returned"},
		{"a stale read", []porcupine.Operation{w(1, 0, 10, 0, 5), w(2, 12, 18, 0, 6), r(3, 20, 30, 0, 5)},
			"op 2 read 5 from op 0, though op 1 began after that and was acknowledged before the read began (a stale read)"},
		{"nothing read after a write", []porcupine.Operation{w(1, 0, 10, 0, 5), r(3, 20, 30, 0, Absent)},
			"op 1 read nothing, though op 0 had been acknowledged before it began"},
		{"a cas that swapped a stale value", []porcupine.Operation{w(1, 0, 10, 0, 5), w(2, 12, 18, 0, 6),
			regOp(3, 20, 30, RegisterInput{Key: 0, Kind: RegCAS, Expected: 5, Value: 8}, RegisterOutput{OK: true})},
			"op 2 read 5 from op 0, though op 1 began after that and was acknowledged before the read began (a stale read)"},
	} {
		got := RegisterWitnesses(tc.ops, func(i int) string { return fmt.Sprintf("op %d", i) }, 5)
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%s: witnesses %q in a legal history", tc.name, got)
		case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
			t.Errorf("%s: witnesses %q, want [%q]", tc.name, got, tc.want)
		}
		if legal := porcupine.CheckOperations(RegisterModel, tc.ops); legal != (tc.want == "") {
			t.Errorf("%s: porcupine says linearizable = %v, but the witnesses say %v", tc.name, legal, tc.want == "")
		}
	}
}
