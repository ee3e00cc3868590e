package history

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// RegisterOpKind is what one register operation does.
type RegisterOpKind uint8

// Register operation kinds.
const (
	// RegRead reads the register.
	RegRead RegisterOpKind = iota
	// RegWrite sets it to Value.
	RegWrite
	// RegCAS sets it to Value if it holds Expected.
	RegCAS
)

// RegisterInput is one operation on register Key.
type RegisterInput struct {
	Key      int
	Kind     RegisterOpKind
	Value    int // RegWrite, RegCAS: the new value, unique per write
	Expected int // RegCAS: the value it must hold (Absent: unset)
}

// RegisterOutput is what a register operation returned. Unknown marks an
// operation whose commit outcome is unknown: it is recorded with an infinite
// return, and the model accepts whatever it may have done.
type RegisterOutput struct {
	Value   int  // RegRead: the value read (Absent: unset)
	OK      bool // RegCAS: whether it swapped
	Unknown bool
}

// RegisterModel is porcupine's model of independent read/write/compare-and-set
// registers, partitioned by key, each starting Absent: a history is legal iff
// each register's operations are linearizable.
var RegisterModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[int][]porcupine.Operation{}
		var keys []int
		for _, op := range history {
			k := op.Input.(RegisterInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return Absent },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s, in, out := state.(int), input.(RegisterInput), output.(RegisterOutput)
		switch in.Kind {
		case RegRead:
			return out.Unknown || out.Value == s, s
		case RegWrite:
			return true, in.Value
		default: // RegCAS
			swaps := s == in.Expected
			if !out.Unknown && out.OK != swaps {
				return false, s
			}
			if swaps {
				return true, in.Value
			}
			return true, s
		}
	},
	Equal: func(a, b interface{}) bool { return a.(int) == b.(int) },
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(RegisterInput), output.(RegisterOutput)
		suffix := ""
		if out.Unknown {
			suffix = " (unknown)"
		}
		switch in.Kind {
		case RegRead:
			return fmt.Sprintf("read(r%d)=%d%s", in.Key, out.Value, suffix)
		case RegWrite:
			return fmt.Sprintf("write(r%d,%d)%s", in.Key, in.Value, suffix)
		default:
			return fmt.Sprintf("cas(r%d,%d→%d)=%v%s", in.Key, in.Expected, in.Value, out.OK, suffix)
		}
	},
	DescribeState: func(state interface{}) string { return fmt.Sprint(state.(int)) },
}
