package storage

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// GCStats counts what one CollectMVCC call found and staged.
type GCStats struct {
	// Keys is how many user keys were examined.
	Keys int
	// Versions is how many versions were staged for deletion.
	Versions int
	// Bytes is the encoded size (engine key and value) of those versions.
	Bytes int64
	// RangeDeletes is how many keys had their versions deleted by one
	// range deletion instead of a point deletion each (GCRangeDeleteMin).
	RangeDeletes int
}

// GCRangeDeleteMin is the number of collectable versions of one key from
// which CollectMVCC deletes them with one Pebble range deletion rather than
// a point deletion each: a key's collectable versions are always the
// oldest ones, contiguous in the engine, and a range deletion is one entry
// in the batch and the log however many versions it covers, which
// compactions then drop wholesale. Below it, point deletions keep the LSM
// free of many small range tombstones, which reads would have to step over.
const GCRangeDeleteMin = 16

// Add adds o's counts to s.
func (s *GCStats) Add(o GCStats) {
	s.Keys += o.Keys
	s.Versions += o.Versions
	s.Bytes += o.Bytes
	s.RangeDeletes += o.RangeDeletes
}

// CollectMVCC stages in b the deletion of every version of each user key in
// [start, end) under prefix (a nil end: to the end of the key space) that no
// read at or above horizon can see (DESIGN.md §14): below horizon it keeps
// only the key's newest version, and drops that one too when it is a
// tombstone, since it then hides nothing. Versions at or above horizon are
// never touched. A key with GCRangeDeleteMin collectable versions or more
// loses them by one range deletion, the others by point deletions. It
// examines at most maxKeys keys (0: no limit) and returns
// the key to resume from, or nil when it reached end. The deletions depend
// only on versions below horizon, which no commit writes any more, so every
// replica applying the same call at the same log index deletes the same
// versions. It reads the value of no version but a key's newest below
// horizon, and that one only when it is short enough to be a tombstone
// (the others may be in blob files). Errors wrap ErrCorrupt for an
// undecodable key or such a value.
func (e *Engine) CollectMVCC(b *pebble.Batch, prefix, start, end []byte, horizon VersionID, maxKeys int) (stats GCStats, resume []byte, err error) {
	lo, hi := MVCCKeyBounds(prefix, start, end)
	var (
		cur  []byte // the user key whose versions are being read
		seen bool   // cur's newest version below horizon has been seen
		g    garbage
	)
	err = e.ScanLazy(lo, hi, func(k []byte, lv *LazyValue) (bool, error) {
		vlen := lv.Len()
		key, ver, err := DecodeMVCCKey(prefix, k)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if cur == nil || !bytes.Equal(key, cur) {
			if err := g.flush(b, prefix, cur, &stats); err != nil {
				return false, err
			}
			if maxKeys > 0 && stats.Keys == maxKeys {
				resume = key
				return false, nil
			}
			cur, seen = key, false
			stats.Keys++
		}
		if !ver.Less(horizon) {
			return true, nil // a read at or above horizon may see it
		}
		if seen {
			g.add(k, vlen) // shadowed below horizon
			return true, nil
		}
		seen = true
		if vlen > tombstoneLen {
			return true, nil // longer than a tombstone, whose value is its kind alone: kept unread
		}
		v, err := lv.Value()
		if err != nil {
			return false, err
		}
		_, tomb, err := DecodeMVCCValue(v)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if tomb {
			g.add(k, vlen) // hides only what goes with it
		}
		return true, nil
	})
	if err == nil {
		err = g.flush(b, prefix, cur, &stats)
	}
	return stats, resume, err
}

// garbage gathers the collectable versions of one user key: they come
// last among its versions, so from the first on they run to the key's end.
type garbage struct {
	first  []byte   // the first one's engine key
	points [][]byte // their engine keys, until there are GCRangeDeleteMin
	n      int
	bytes  int64
}

func (g *garbage) add(k []byte, vlen int) {
	if g.n == 0 {
		g.first = append(g.first[:0], k...)
	}
	if g.n < GCRangeDeleteMin {
		g.points = append(g.points, append([]byte(nil), k...))
	} else {
		g.points = g.points[:0]
	}
	g.n++
	g.bytes += int64(len(k) + vlen)
}

// flush stages the deletion of key's collectable versions and resets g.
func (g *garbage) flush(b *pebble.Batch, prefix, key []byte, stats *GCStats) error {
	defer func() { g.n, g.bytes, g.points = 0, 0, g.points[:0] }()
	if g.n == 0 {
		return nil
	}
	stats.Versions += g.n
	stats.Bytes += g.bytes
	if g.n >= GCRangeDeleteMin {
		stats.RangeDeletes++
		// Just past the key's oldest possible version: no other key sorts between.
		end := append(EncodeMVCCKey(prefix, key, VersionID{}), 0)
		return b.DeleteRange(g.first, end, nil)
	}
	for _, k := range g.points {
		if err := b.Delete(k, nil); err != nil {
			return err
		}
	}
	return nil
}
