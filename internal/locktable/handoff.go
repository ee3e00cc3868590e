package locktable

import "bytes"

// Grant is a lock a transaction holds: what SplitOff hands over and Install
// takes.
type Grant struct {
	Txn  Txn
	Span Span
	Mode Mode
}

// SplitOff removes from the table every lock at or above key, for the range
// that takes those keys over at a split (DESIGN.md §11), and returns them: a
// range lock that straddles key is cut, its part below key kept here and its
// part from key on handed over (so a transaction holding it counts it in
// both tables). Requests waiting for spans that reach key or beyond are
// woken: they find their range changed. A transaction left with no lock here
// is forgotten, as by ReleaseAll.
func (t *Table) SplitOff(key []byte) []Grant {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Grant
	var gone []*keyEntry
	t.points.AscendGreaterOrEqual(&keyEntry{key: string(key)}, func(e *keyEntry) bool {
		for _, h := range e.holders {
			out = append(out, Grant{Txn: h.txn, Span: Point([]byte(e.key)), Mode: h.mode})
		}
		gone = append(gone, e)
		return true
	})
	for _, e := range gone {
		t.points.Delete(e)
	}
	kept := t.ranges[:0]
	for _, r := range t.ranges {
		switch {
		case bytes.Compare(r.span.EndKey, key) <= 0: // wholly below
			kept = append(kept, r)
		case bytes.Compare(r.span.Key, key) >= 0: // wholly at or above
			out = append(out, Grant{Txn: r.txn, Span: r.span, Mode: r.mode})
		default: // straddles key: cut
			out = append(out, Grant{Txn: r.txn, Span: Span{Key: key, EndKey: r.span.EndKey}, Mode: r.mode})
			r.span = Span{Key: r.span.Key, EndKey: append([]byte(nil), key...)}
			kept = append(kept, r)
		}
	}
	clear(t.ranges[len(kept):])
	t.ranges = kept
	touched := map[TxnID]bool{}
	for _, g := range out {
		touched[g.Txn.ID] = true
	}
	for id := range touched {
		var spans []Span
		for _, s := range t.byTxn[id] {
			switch {
			case bytes.Compare(s.Key, key) >= 0: // handed over whole
			case !s.isPoint() && bytes.Compare(s.EndKey, key) > 0: // cut
				spans = append(spans, Span{Key: s.Key, EndKey: append([]byte(nil), key...)})
			default:
				spans = append(spans, s)
			}
		}
		if len(spans) == 0 {
			delete(t.byTxn, id)
			delete(t.prepared, id)
		} else {
			t.byTxn[id] = spans
		}
	}
	for w := range t.waiters {
		if (w.span.isPoint() && bytes.Compare(w.span.Key, key) >= 0) || (!w.span.isPoint() && bytes.Compare(w.span.EndKey, key) > 0) {
			close(w.wake)
			delete(t.waiters, w)
		}
	}
	return out
}

// Install grants gs without waiting or checking for conflicts: the locks
// another range's table held, handed over by SplitOff, which never conflict
// among themselves. A lock the transaction already holds is kept in the
// stronger mode.
func (t *Table) Install(gs []Grant) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, g := range gs {
		t.grant(g.Txn, cloneSpan(g.Span), g.Mode)
	}
}
