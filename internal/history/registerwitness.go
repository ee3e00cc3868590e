package history

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// RegisterWitnesses names, in a history of RegisterModel operations, up
// to max reads that no linearization can explain, each with the
// operations that show it: a value no recorded write wrote, a value
// written only after the read returned, or a value some completed write
// had already overwritten before the read began. A compare-and-set that
// swapped counts as a read of its Expected value. name describes the
// operation at an index of ops (its kind, times, client).
//
// It looks at pairs and triples of operations only, so it finds the
// anomalies a campaign meets most (lost, phantom, future and stale
// reads) but not every illegal history: porcupine decides; this
// explains. Values are unique per write (RegisterInput.Value), and the
// registers are never deleted, so a register that has held a value never
// reads Absent again.
func RegisterWitnesses(ops []porcupine.Operation, name func(i int) string, max int) []string {
	type write struct {
		i          int
		call, ret  int64
		acked      bool // its return is known: it is linearized by then
		key, value int
	}
	writes := map[int]write{}  // by value
	byKey := map[int][]write{} // the acknowledged writes of each register
	for i, op := range ops {
		in, out := op.Input.(RegisterInput), op.Output.(RegisterOutput)
		if in.Kind == RegRead || in.Kind == RegCAS && !out.OK && !out.Unknown {
			continue
		}
		w := write{i: i, call: op.Call, ret: op.Return, acked: !out.Unknown, key: in.Key, value: in.Value}
		writes[in.Value] = w
		if w.acked {
			byKey[in.Key] = append(byKey[in.Key], w)
		}
	}
	var found []string
	for i, op := range ops {
		if len(found) >= max {
			break
		}
		in, out := op.Input.(RegisterInput), op.Output.(RegisterOutput)
		if out.Unknown {
			continue
		}
		v := out.Value
		switch {
		case in.Kind == RegCAS && out.OK:
			v = in.Expected
		case in.Kind != RegRead:
			continue
		}
		w, known := writes[v]
		switch {
		case v != Absent && !known:
			found = append(found, fmt.Sprintf("%s read %d, which no recorded write wrote (a write reported failed took effect?)", name(i), v))
			continue
		case v != Absent && known && w.key != in.Key:
			found = append(found, fmt.Sprintf("%s read %d, which %s wrote to register %d", name(i), v, name(w.i), w.key))
			continue
		case v != Absent && w.call > op.Return:
			found = append(found, fmt.Sprintf("%s read %d, which %s wrote only after the read returned", name(i), v, name(w.i)))
			continue
		}
		// Stale: a write acknowledged before the read began, begun after
		// the value read was acknowledged, must be linearized between them.
		for _, later := range byKey[in.Key] {
			if later.value == v || later.ret >= op.Call || v != Absent && later.call <= w.ret {
				continue
			}
			if v == Absent {
				found = append(found, fmt.Sprintf("%s read nothing, though %s had been acknowledged before it began", name(i), name(later.i)))
			} else {
				found = append(found, fmt.Sprintf("%s read %d from %s, though %s began after that and was acknowledged before the read began (a stale read)",
					name(i), v, name(w.i), name(later.i)))
			}
			break
		}
	}
	return found
}
