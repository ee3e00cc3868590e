package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// VersionID orders the versions of a key (paper §5.1, DESIGN.md §6): the global
// epoch of the writing transaction, then a counter (from 1) that separates
// transactions of one epoch. The zero VersionID sorts below every version.
type VersionID struct {
	Epoch   uint64
	Counter uint32
}

// Less reports whether v sorts before o.
func (v VersionID) Less(o VersionID) bool {
	if v.Epoch != o.Epoch {
		return v.Epoch < o.Epoch
	}
	return v.Counter < o.Counter
}

// Next returns the smallest version id above v.
func (v VersionID) Next() VersionID {
	if v.Counter == ^uint32(0) {
		return VersionID{Epoch: v.Epoch + 1, Counter: 1}
	}
	return VersionID{Epoch: v.Epoch, Counter: v.Counter + 1}
}

// EpochStart is <e, 0>: reading "as of the start of epoch e" sees exactly the
// versions below it.
func EpochStart(e uint64) VersionID { return VersionID{Epoch: e} }

func (v VersionID) String() string { return fmt.Sprintf("<%d,%d>", v.Epoch, v.Counter) }

// versionLen is the encoded size of a VersionID: 8 + 4 bytes.
const versionLen = 12

// ErrBadKey marks an MVCC key or value that does not decode.
var ErrBadKey = errors.New("storage: malformed MVCC key or value")

// MVCC keys within a key space (a replica's data, under a caller-chosen prefix):
//
//	prefix | escaped user key | 0x00 0x01 | ^epoch (8 bytes BE) | ^counter (4 bytes BE)
//
// The user key is escaped (0x00 → 0x00 0xff) and terminated by 0x00 0x01, so keys
// sort by user key first and a key sorts before its extensions; the version is
// inverted, so the newest version is the first hit of a seek.

// appendEscaped appends the escaped, terminated user key.
func appendEscaped(dst, key []byte) []byte {
	for _, c := range key {
		if c == 0 {
			dst = append(dst, 0, 0xff)
		} else {
			dst = append(dst, c)
		}
	}
	return append(dst, 0, 1)
}

// EncodeMVCCKey returns the engine key of version v of key under prefix.
func EncodeMVCCKey(prefix, key []byte, v VersionID) []byte {
	out := make([]byte, 0, len(prefix)+len(key)+2+versionLen+4)
	out = appendEscaped(append(out, prefix...), key)
	out = binary.BigEndian.AppendUint64(out, ^v.Epoch)
	return binary.BigEndian.AppendUint32(out, ^v.Counter)
}

// decodeVersion decodes the inverted version id (versionLen bytes) that
// ends an MVCC key.
func decodeVersion(b []byte) VersionID {
	return VersionID{Epoch: ^binary.BigEndian.Uint64(b), Counter: ^binary.BigEndian.Uint32(b[8:])}
}

// MVCCKeyBounds returns [lo, hi) covering every version of every user key in
// [start, end) under prefix; a nil end means the end of the key space.
func MVCCKeyBounds(prefix, start, end []byte) (lo, hi []byte) {
	lo = appendEscaped(append([]byte{}, prefix...), start)
	lo = lo[:len(lo)-2] // the escaped key without its terminator sorts before all its versions
	if end == nil {
		return lo, PrefixEnd(prefix)
	}
	hi = appendEscaped(append([]byte{}, prefix...), end)
	return lo, hi[:len(hi)-2]
}

// PrefixEnd returns the smallest key greater than every key with prefix p (nil if
// p is all 0xff).
func PrefixEnd(p []byte) []byte {
	out := append([]byte{}, p...)
	for i := len(out) - 1; i >= 0; i-- {
		if out[i] != 0xff {
			out[i]++
			return out[:i+1]
		}
	}
	return nil
}

// DecodeMVCCKey splits an engine key under prefix into its user key and version.
// Errors wrap ErrBadKey.
func DecodeMVCCKey(prefix, k []byte) ([]byte, VersionID, error) {
	if !bytes.HasPrefix(k, prefix) {
		return nil, VersionID{}, fmt.Errorf("%w: missing prefix", ErrBadKey)
	}
	rest := k[len(prefix):]
	key := make([]byte, 0, len(rest))
	for i := 0; ; i++ {
		if i >= len(rest) {
			return nil, VersionID{}, fmt.Errorf("%w: unterminated user key", ErrBadKey)
		}
		c := rest[i]
		if c != 0 {
			key = append(key, c)
			continue
		}
		if i+1 >= len(rest) {
			return nil, VersionID{}, fmt.Errorf("%w: truncated escape", ErrBadKey)
		}
		switch rest[i+1] {
		case 0xff:
			key = append(key, 0)
			i++
			continue
		case 1:
			ver := rest[i+2:]
			if len(ver) != versionLen {
				return nil, VersionID{}, fmt.Errorf("%w: version of %d bytes", ErrBadKey, len(ver))
			}
			return key, decodeVersion(ver), nil
		default:
			return nil, VersionID{}, fmt.Errorf("%w: bad escape 0x00 0x%02x", ErrBadKey, rest[i+1])
		}
	}
}

// MVCC value kinds.
const (
	valueKindPut       byte = 1
	valueKindTombstone byte = 2
)

// tombstoneLen is the length of a tombstone's value (EncodeMVCCValue(nil,
// true)): its kind byte alone. A longer value is no tombstone, which lets
// GC tell without reading it (CollectMVCC).
const tombstoneLen = 1

// EncodeMVCCValue encodes a value, or a tombstone if tombstone is set.
func EncodeMVCCValue(value []byte, tombstone bool) []byte {
	if tombstone {
		return []byte{valueKindTombstone}
	}
	return append([]byte{valueKindPut}, value...)
}

// DecodeMVCCValue returns the value and whether it is a tombstone. The value
// aliases v. Errors wrap ErrBadKey.
func DecodeMVCCValue(v []byte) (value []byte, tombstone bool, err error) {
	if len(v) == 0 {
		return nil, false, fmt.Errorf("%w: empty value", ErrBadKey)
	}
	switch v[0] {
	case valueKindPut:
		return v[1:], false, nil
	case valueKindTombstone:
		if len(v) != 1 {
			return nil, false, fmt.Errorf("%w: tombstone with payload", ErrBadKey)
		}
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("%w: value kind %d", ErrBadKey, v[0])
}

// Version is one stored version of a key.
type Version struct {
	Key       []byte
	ID        VersionID
	Value     []byte
	Tombstone bool
}

// ScanMVCC calls fn, in key order, with each user key in [start, end) under
// prefix that has any version: its newest version below `below` (visible.ID is
// zero if it has none; visible.Tombstone marks a delete) and the key's newest
// version overall (the two are equal when nothing newer exists). Readers skip
// keys where Live is false. fn returning false stops the scan. A nil end scans
// to the end of the key space. Slices passed to fn are copies the callee may keep.
func (e *Engine) ScanMVCC(prefix, start, end []byte, below VersionID, fn func(visible Version, newest VersionID) bool) error {
	return scanMVCC(e.db, prefix, start, end, below, fn)
}

// ScanMVCCBatch is ScanMVCC over an indexed batch: the engine's state with
// the batch's writes over it (a state machine reading what the entries
// applied before it in the same batch wrote).
func ScanMVCCBatch(b *pebble.Batch, prefix, start, end []byte, below VersionID, fn func(visible Version, newest VersionID) bool) error {
	return scanMVCC(b, prefix, start, end, below, fn)
}

func scanMVCC(r reader, prefix, start, end []byte, below VersionID, fn func(visible Version, newest VersionID) bool) error {
	lo, hi := MVCCKeyBounds(prefix, start, end)
	var (
		cur     []byte
		newest  VersionID
		pending bool // cur has no version below `below` yet
	)
	// A key with no version below `below` is reported when the next key starts
	// (or at the end), since only then is it known to have none.
	flushNone := func() bool {
		if !pending {
			return true
		}
		pending = false
		return fn(Version{Key: cur}, newest)
	}
	stopped := false
	err := scan(r, lo, hi, func(k, v []byte) (bool, error) {
		key, ver, err := DecodeMVCCKey(prefix, k)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if cur == nil || !bytes.Equal(key, cur) {
			if !flushNone() {
				stopped = true
				return false, nil
			}
			cur, newest, pending = key, ver, true
		}
		if !pending || !ver.Less(below) {
			return true, nil
		}
		pending = false
		val, tomb, err := DecodeMVCCValue(v)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		vis := Version{Key: key, ID: ver, Tombstone: tomb}
		if !tomb {
			vis.Value = append([]byte{}, val...)
		}
		if !fn(vis, newest) {
			stopped = true
			return false, nil
		}
		return true, nil
	})
	if err == nil && !stopped {
		flushNone()
	}
	return err
}

// Live reports whether v is a value a reader sees: a version exists below the
// read's bound and it is not a tombstone.
func (v Version) Live() bool { return v.ID != (VersionID{}) && !v.Tombstone }

// GetMVCC returns key's newest version below `below` (ok false if none, or if it
// is a tombstone; v.ID and v.Tombstone still tell which) and the key's newest
// version id overall (zero if the key was never written).
func (e *Engine) GetMVCC(prefix, key []byte, below VersionID) (v Version, ok bool, newest VersionID, err error) {
	lo := appendEscaped(append(make([]byte, 0, len(prefix)+len(key)+2), prefix...), key)
	ent, hit, rows, gen := e.cachedNewest(lo, func(ent rowEntry) bool { return ent.full && ent.id.Less(below) })
	if hit {
		v = Version{Key: append([]byte{}, key...), ID: ent.id, Tombstone: ent.tomb}
		if !ent.tomb {
			v.Value, ok = append([]byte{}, ent.value...), true
		}
		return v, ok, ent.id, nil
	}
	hi := PrefixEnd(lo)
	first := true
	err = e.Scan(lo, hi, func(k, val []byte) (bool, error) {
		_, ver, err := DecodeMVCCKey(prefix, k)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if first {
			newest, first = ver, false
		}
		if !ver.Less(below) {
			return true, nil
		}
		data, tomb, err := DecodeMVCCValue(val)
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		v = Version{Key: append([]byte{}, key...), ID: ver, Tombstone: tomb}
		if !tomb {
			v.Value, ok = append([]byte{}, data...), true
		}
		return false, nil
	})
	if err == nil && rows != nil && !first && v.ID == newest {
		// The newest version was the one read: the cache may keep it.
		rows.put(lo, rowEntry{id: newest, tomb: v.Tombstone, full: true, value: v.Value}, gen)
	}
	return v, ok, newest, err
}

// NewestVersion returns the id of key's newest version under prefix,
// tombstones included (ok false when it has none), reading neither the
// value nor a copy of the key: a commit's look at its write set (DESIGN.md
// §4.2), which needs the id alone (GetMVCC copies a value out, a whole
// row's; issue 17). Errors wrap ErrCorrupt.
func (e *Engine) NewestVersion(prefix, key []byte) (v VersionID, ok bool, err error) {
	lo := appendEscaped(append(make([]byte, 0, len(prefix)+len(key)+2), prefix...), key)
	ent, hit, rows, gen := e.cachedNewest(lo, func(rowEntry) bool { return true })
	if hit {
		return ent.id, true, nil
	}
	// Every key in [lo, hi) is lo and a version: hi is lo with its
	// terminator's last byte raised.
	hi := bytes.Clone(lo)
	hi[len(hi)-1]++
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return v, false, wrapReadErr(err)
	}
	if ok = it.First(); ok {
		ver := it.Key()[len(lo):]
		if len(ver) != versionLen {
			err = fmt.Errorf("%w: %v: version of %d bytes", ErrCorrupt, ErrBadKey, len(ver))
		} else {
			v = decodeVersion(ver)
		}
	}
	if cerr := it.Close(); err == nil && cerr != nil {
		err = wrapReadErr(cerr)
	}
	if err != nil {
		return VersionID{}, false, err
	}
	if ok && rows != nil {
		rows.put(lo, rowEntry{id: v}, gen)
	}
	return v, ok, nil
}

// ScanVersions calls fn, in key order and newest first within a key, with
// every version of the user keys in [start, end) under prefix whose id lies in
// [from, below), tombstones included (a changefeed's or an incremental
// backup's read, DESIGN.md §14); with newestOnly, only each key's newest
// version in the window. It seeks past the versions outside the window
// rather than reading them, so a read of a recent window costs about a
// seek per key, not the history kept. fn returning false stops the scan.
// A nil end scans to the end of the key space. Slices passed to fn are
// copies the callee may keep. Errors wrap ErrCorrupt.
func (e *Engine) ScanVersions(prefix, start, end []byte, from, below VersionID, newestOnly bool, fn func(Version) bool) error {
	if !from.Less(below) {
		return nil
	}
	lo, hi := MVCCKeyBounds(prefix, start, end)
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return wrapReadErr(err)
	}
	// last is the newest version below `below`: a seek to it lands on the
	// key's first version inside the window, or past it.
	last := VersionID{Epoch: below.Epoch, Counter: below.Counter - 1}
	if below.Counter == 0 {
		last = VersionID{Epoch: below.Epoch - 1, Counter: ^uint32(0)}
	}
	valid := it.First()
	for valid {
		key, ver, err := DecodeMVCCKey(prefix, it.Key())
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		switch {
		case !ver.Less(below): // newer than the window
			valid = it.SeekGE(EncodeMVCCKey(prefix, key, last))
			continue
		case ver.Less(from): // older: on to the next key
			valid = it.SeekGE(PrefixEnd(appendEscaped(append([]byte{}, prefix...), key)))
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return wrapReadErr(err)
		}
		val, tomb, err := DecodeMVCCValue(v)
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		out := Version{Key: key, ID: ver, Tombstone: tomb}
		if !tomb {
			out.Value = append([]byte{}, val...)
		}
		if !fn(out) {
			break
		}
		if newestOnly {
			valid = it.SeekGE(PrefixEnd(appendEscaped(append([]byte{}, prefix...), key)))
		} else {
			valid = it.Next()
		}
	}
	if err := it.Close(); err != nil {
		return wrapReadErr(err)
	}
	return nil
}
