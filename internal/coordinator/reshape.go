package coordinator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// A range can change shape under an open transaction (DESIGN.md §11): a
// split hands the locks at or above its key, with the transaction's record
// and incarnation, to the new right-hand range; a merge's subsumed range
// drops its transactions. Commit and the heartbeats send the generation of
// each range as the transaction knew it; a range that changed shape since
// answers with a mismatch, and the transaction moves what it tracked there
// to the ranges that now hold it (repartition) and tries again. Where the
// locks did not follow (a merge, a handover to another node), the
// incarnations disagree and the transaction aborts: never silently.

// maxRepartitions bounds how often one Commit moves its participants after
// ranges changed shape before it gives up (ErrConflict: retry).
const maxRepartitions = 4

// decodeSpan inverts pointSpan and rangeSpan: a point (end nil, point true),
// or [start, end) with a nil end unbounded.
func decodeSpan(s string) (start, end []byte, point bool, err error) {
	switch {
	case len(s) >= 1 && s[0] == 'p':
		return []byte(s[1:]), nil, true, nil
	case len(s) >= 5 && s[0] == 'r':
		n := int(binary.BigEndian.Uint32([]byte(s[1:5])))
		if 5+n <= len(s) {
			start, end = []byte(s[5:5+n]), []byte(s[5+n:])
			if len(end) == 0 {
				end = nil
			}
			return start, end, false, nil
		}
	}
	return nil, nil, false, fmt.Errorf("coordinator: malformed tracked span %q", s)
}

// repartition moves what the transaction tracked at ranges that changed
// shape since it learned them — the spans it locked, with their
// incarnation, and the keys of its writes — to the ranges that now hold
// them, as the routing cache has them (a mismatch reply just refreshed it).
// A participant whose range kept its generation stays. Callers hold t.mu.
// Errors: ErrConflict (the locks did not follow: another incarnation holds
// the range that took them), or a routing error.
func (t *Txn) repartition(ctx context.Context) error {
	var stale []*participant
	for id, p := range t.parts {
		d, err := t.c.routes.Lookup(ctx, p.desc.GetStartKey())
		if err != nil {
			return fmt.Errorf("%w: routing %q: %v", ErrUnavailable, p.desc.GetStartKey(), err)
		}
		if d.GetRangeId() != id || d.GetGeneration() != p.desc.GetGeneration() {
			stale = append(stale, p)
			delete(t.parts, id)
		}
	}
	for _, p := range stale {
		for span := range p.spans {
			start, end, point, err := decodeSpan(span)
			if err != nil {
				return err
			}
			if point {
				d, err := t.c.routes.Lookup(ctx, start)
				if err != nil {
					return fmt.Errorf("%w: routing %q: %v", ErrUnavailable, start, err)
				}
				if err := t.moveLock(d, span, p.incarnation); err != nil {
					return err
				}
				continue
			}
			parts, err := t.c.routes.Overlapping(ctx, start, end)
			if err != nil {
				return fmt.Errorf("%w: routing [%q, %q): %v", ErrUnavailable, start, end, err)
			}
			for _, part := range parts {
				if err := t.moveLock(part.Desc, rangeSpan(part.Start, part.End), p.incarnation); err != nil {
					return err
				}
			}
		}
		for key := range p.writes {
			d, err := t.c.routes.Lookup(ctx, []byte(key))
			if err != nil {
				return fmt.Errorf("%w: routing %q: %v", ErrUnavailable, key, err)
			}
			t.part(d).writes[key] = struct{}{}
		}
	}
	return nil
}

// moveLock records span, locked under incarnation inc, at range d.
func (t *Txn) moveLock(d *pb.RangeDescriptor, span string, inc uint64) error {
	if err := t.part(d).locked(span, inc); err != nil {
		return err
	}
	t.hb.track(d, inc)
	return nil
}

// isReshaped reports a commit step that did not execute because a
// participant changed shape: repartition, and try again.
func isReshaped(err error) bool { return errors.Is(err, errStaleRoute) }
