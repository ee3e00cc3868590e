// Package history records what clients saw and checks it with porcupine: a
// history of transactions over a small key set is strictly serializable iff it
// is linearizable with each transaction as one operation on the whole map.
package history

import (
	"fmt"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Keys is the size of the key space the transaction model covers.
const Keys = 6

// Absent is the model's value of a key that does not exist.
const Absent = -1

// State is the whole map: State[k] is key k's value, or Absent.
type State [Keys]int

// OpKind is what one operation inside a transaction does.
type OpKind uint8

// Operation kinds.
const (
	Get OpKind = iota
	Put
	Del
	Scan
)

// Op is one operation of a transaction. Scan covers keys Key ≤ k < Hi.
type Op struct {
	Kind    OpKind
	Key, Hi int
	Value   int // for Put: unique per write, so reads identify their writer
}

// Result is what one operation returned: for Get, Value; for Scan, Values[k-Key]
// for each k in [Key, Hi).
type Result struct {
	Value  int
	Values []int
}

// Txn is a transaction's input.
type Txn struct{ Ops []Op }

// Outcome is a committed transaction's output: one Result per Op.
type Outcome struct{ Results []Result }

// Apply runs txn against s and reports whether its results are what s produces.
func Apply(s State, txn Txn, out Outcome) (bool, State) {
	if len(out.Results) != len(txn.Ops) {
		return false, s
	}
	for i, op := range txn.Ops {
		r := out.Results[i]
		switch op.Kind {
		case Get:
			if s[op.Key] != r.Value {
				return false, s
			}
		case Put:
			s[op.Key] = op.Value
		case Del:
			s[op.Key] = Absent
		case Scan:
			if len(r.Values) != op.Hi-op.Key {
				return false, s
			}
			for k := op.Key; k < op.Hi; k++ {
				if s[k] != r.Values[k-op.Key] {
					return false, s
				}
			}
		}
	}
	return true, s
}

// Model is the porcupine model: state is the whole map, one transaction is one
// operation (input Txn, output Outcome).
var Model = porcupine.Model{
	Init: func() interface{} {
		var s State
		for i := range s {
			s[i] = Absent
		}
		return s
	},
	Step: func(state, input, output interface{}) (bool, interface{}) {
		return Apply(state.(State), input.(Txn), output.(Outcome))
	},
	DescribeOperation: func(input, output interface{}) string {
		var b strings.Builder
		for i, op := range input.(Txn).Ops {
			r := output.(Outcome).Results[i]
			switch op.Kind {
			case Get:
				fmt.Fprintf(&b, "get(%d)=%d ", op.Key, r.Value)
			case Put:
				fmt.Fprintf(&b, "put(%d,%d) ", op.Key, op.Value)
			case Del:
				fmt.Fprintf(&b, "del(%d) ", op.Key)
			case Scan:
				fmt.Fprintf(&b, "scan[%d,%d)=%v ", op.Key, op.Hi, r.Values)
			}
		}
		return b.String()
	},
}

// Recorder collects completed operations from concurrent clients.
// Transactions whose outcome is unknown are included as their writes alone,
// returning at the end of time, as Jepsen records an indeterminate operation:
// the checker may place one anywhere after its call, including after every
// read (as if it never ran). Its reads are not known, so they are dropped.
type Recorder struct {
	ops     []porcupine.Operation
	unknown []porcupine.Operation
}

// Committed records a committed transaction.
func (r *Recorder) Committed(client int, txn Txn, out Outcome, call, ret int64) {
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: txn, Output: out, Call: call, Return: ret})
}

// Unknown records a transaction whose commit outcome is unknown.
func (r *Recorder) Unknown(client int, txn Txn, out Outcome, call int64) {
	r.unknown = append(r.unknown, porcupine.Operation{ClientId: client, Input: txn, Output: out, Call: call})
}

// Operations returns the history to check. Not safe to call concurrently with
// recording; callers serialize.
func (r *Recorder) Operations() []porcupine.Operation {
	out := append([]porcupine.Operation(nil), r.ops...)
	for _, op := range r.unknown {
		var writes Txn
		var res Outcome
		for _, w := range op.Input.(Txn).Ops {
			if w.Kind == Put || w.Kind == Del {
				writes.Ops = append(writes.Ops, w)
				res.Results = append(res.Results, Result{})
			}
		}
		if len(writes.Ops) == 0 {
			continue // a read-only transaction changes nothing
		}
		op.Input, op.Output, op.Return = writes, res, 1<<62
		out = append(out, op)
	}
	return out
}

// Len returns the number of committed and unknown transactions recorded.
func (r *Recorder) Len() (committed, unknown int) { return len(r.ops), len(r.unknown) }
