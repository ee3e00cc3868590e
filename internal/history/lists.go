package history

import (
	"fmt"
	"slices"
	"sort"
)

// ListOp is one transaction of the list-append workload (as in Jepsen's
// Elle): it appends a unique element to some lists, each append reading the
// list it extends, or it only reads lists.
type ListOp struct {
	// Client names who ran it, for messages.
	Client int
	// Appends maps a list to the element this transaction appended to it;
	// elements are unique across the whole history.
	Appends map[int]int
	// Reads maps a list to what the transaction read of it; for an append,
	// the list just before the append.
	Reads map[int][]int
	// Fresh marks reads that must reflect every append acknowledged before
	// the transaction began: a locking transaction, or a snapshot in a mode
	// that is linearizable per key.
	Fresh bool
	// Call and Return are when the transaction began and was acknowledged
	// (ns since the run began).
	Call, Return int64
	// Outcome is what the client was told.
	Outcome ListOutcome
}

// ListOutcome is what a list transaction's client was told.
type ListOutcome uint8

// List outcomes.
const (
	// ListCommitted: acknowledged.
	ListCommitted ListOutcome = iota
	// ListUnknown: the commit's outcome is unknown.
	ListUnknown
	// ListFailed: definitely not committed.
	ListFailed
)

// CheckLists checks a list-append history against final, each list's
// contents read after the run by a locking transaction, and returns every
// anomaly found:
//   - a final list holds an element twice, or one no committed or unknown
//     transaction appended (an aborted write visible, or a phantom);
//   - an acknowledged append is missing (a lost write);
//   - a read is not a prefix of the final list (lists diverged), or an
//     append was not placed right after the list it read (a lost update);
//   - a transaction saw only some of another's appends (fractured read);
//   - a fresh read missed an append acknowledged before it began, or saw a
//     list shorter than any read that returned before it began.
//
// Only committed transactions' reads are checked.
func CheckLists(ops []ListOp, final map[int][]int) []string {
	var out []string
	wrote := map[int]listOrigin{} // element → who appended it
	for i, op := range ops {
		if op.Outcome == ListFailed {
			continue
		}
		for l, e := range op.Appends {
			wrote[e] = listOrigin{i, l}
		}
	}
	failed := map[int]bool{}
	for _, op := range ops {
		if op.Outcome == ListFailed {
			for _, e := range op.Appends {
				failed[e] = true
			}
		}
	}
	pos := map[int]int{} // element → its index in its final list
	for l, list := range final {
		for i, e := range list {
			if _, dup := pos[e]; dup {
				out = append(out, fmt.Sprintf("list %d holds element %d twice", l, e))
			}
			pos[e] = i
			switch o, ok := wrote[e]; {
			case failed[e]:
				out = append(out, fmt.Sprintf("list %d holds %d, appended by a transaction that failed", l, e))
			case !ok || o.list != l:
				out = append(out, fmt.Sprintf("list %d holds %d, which no transaction appended to it", l, e))
			}
		}
	}
	for i, op := range ops {
		if op.Outcome != ListCommitted {
			continue
		}
		for l, e := range op.Appends {
			p, ok := pos[e]
			if !ok {
				out = append(out, fmt.Sprintf("client %d's acknowledged append of %d to list %d was lost", op.Client, e, l))
				continue
			}
			if prior := op.Reads[l]; p != len(prior) {
				out = append(out, fmt.Sprintf("client %d appended %d to list %d after reading %d elements, but it sits at %d", op.Client, e, l, len(prior), p))
			}
		}
		for l, got := range op.Reads {
			if !isPrefix(got, final[l]) {
				out = append(out, fmt.Sprintf("op %d (client %d) read list %d as %v, not a prefix of its final %v", i, op.Client, l, got, final[l]))
			}
		}
		out = append(out, fractured(ops, i, wrote)...)
	}
	return append(out, stale(ops)...)
}

// listOrigin is the transaction (its index) that appended an element, and the list.
type listOrigin struct{ op, list int }

func isPrefix(p, list []int) bool { return len(p) <= len(list) && slices.Equal(p, list[:len(p)]) }

// fractured reports the transactions whose appends op i saw only in part,
// among the lists it read.
func fractured(ops []ListOp, i int, wrote map[int]listOrigin) []string {
	op := ops[i]
	seen := map[int]map[int]bool{} // writer op → list → seen
	for l, got := range op.Reads {
		for _, e := range got {
			if o, ok := wrote[e]; ok {
				if seen[o.op] == nil {
					seen[o.op] = map[int]bool{}
				}
				seen[o.op][l] = true
			}
		}
	}
	var out []string
	for w, lists := range seen {
		if w == i {
			continue
		}
		for l := range ops[w].Appends {
			if _, read := op.Reads[l]; read && !lists[l] {
				out = append(out, fmt.Sprintf("op %d (client %d) saw op %d's appends to lists %v but not to list %d", i, op.Client, w, keysOf(lists), l))
			}
		}
	}
	return out
}

func keysOf(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// stale reports fresh reads that missed an append acknowledged before they
// began, or went back behind any read that returned before they began.
func stale(ops []ListOp) []string {
	byCall := make([]int, 0, len(ops))
	for i, op := range ops {
		if op.Outcome == ListCommitted {
			byCall = append(byCall, i)
		}
	}
	byReturn := slices.Clone(byCall)
	sort.Slice(byCall, func(a, b int) bool { return ops[byCall[a]].Call < ops[byCall[b]].Call })
	sort.Slice(byReturn, func(a, b int) bool { return ops[byReturn[a]].Return < ops[byReturn[b]].Return })
	// Sweep in call order; done holds, per list, the longest list any
	// transaction returned before this call is known to imply: an
	// acknowledged append at index p implies p+1 elements, and a read of n
	// elements in any mode implies n (it saw only committed appends).
	type bound struct {
		n  int
		by int
	}
	done := map[int]bound{}
	var out []string
	j := 0
	for _, i := range byCall {
		for ; j < len(byReturn) && ops[byReturn[j]].Return < ops[i].Call; j++ {
			w := ops[byReturn[j]]
			for l, got := range w.Reads {
				n := len(got)
				if _, appended := w.Appends[l]; appended {
					n++
				}
				if n > done[l].n {
					done[l] = bound{n, byReturn[j]}
				}
			}
		}
		op := ops[i]
		if !op.Fresh {
			continue
		}
		for l, got := range op.Reads {
			if b := done[l]; len(got) < b.n {
				out = append(out, fmt.Sprintf("op %d (client %d) read %d elements of list %d, but op %d, which returned before it began, implies %d", i, op.Client, len(got), l, b.by, b.n))
			}
		}
	}
	return out
}
