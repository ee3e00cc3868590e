package storage

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// mvccComparerName is the name a store created with mvccComparer records
// in its OPTIONS file and manifest; Pebble refuses to open a store under
// a comparer of another name.
const mvccComparerName = "terroir.mvcc.v1"

// mvccComparer orders keys bytewise, as Pebble's default comparer does, and
// splits an MVCC key (PrefixData, PrefixRegional) after its user key's
// terminator (splitMVCC). Pebble builds each table's bloom filter from
// these prefixes, so a point read of a key's versions (a prefix seek:
// GetMVCC, NewestVersion) skips every table whose filter lacks the key,
// instead of seeking each level's table that spans it (issue 17's steady
// state: without filters, point reads cost more as the LSM deepened).
// Every other key is its own prefix, so Get's filters hold whole keys.
var mvccComparer = func() *pebble.Comparer {
	c := *pebble.DefaultComparer
	c.Name = mvccComparerName
	c.Split = splitMVCC
	return &c
}()

// terminator ends an escaped user key in an MVCC key (appendEscaped).
var terminator = []byte{0, 1}

// splitMVCC returns the length of key's prefix: for a key in an MVCC key
// space, up to and including the first terminator after its space byte
// (the escaped user key, which never holds 0x00 0x01, since every 0x00 in
// it is followed by 0xff); for any other key, or one without a terminator
// (an iterator bound that cuts a user key short), the whole key.
//
// Pebble requires of a Split, for any two keys a and b (the default
// comparer's bytewise order): a key's prefix sorts before the key, and
// a ≤ b implies prefix(a) ≤ prefix(b). Cutting at the first terminator
// keeps both for every byte string, MVCC-shaped or not: two keys that
// first differ before either's cut differ there in their prefixes too,
// and two that first differ after one's cut share that cut.
// TestSplitMVCCKeepsPebblesOrder checks it on adversarial keys.
func splitMVCC(key []byte) int {
	if len(key) == 0 || (key[0] != PrefixData && key[0] != PrefixRegional) {
		return len(key)
	}
	i := bytes.Index(key[1:], terminator)
	if i < 0 {
		return len(key)
	}
	return 1 + i + len(terminator)
}

// storeComparer returns the comparer of the store in dir on fs: the one
// its OPTIONS file names for an existing store, mvccComparer for a new one.
// A store created before mvccComparer (under Pebble's default comparer)
// keeps the default: its tables' key columns were laid out without the
// split, and Pebble refuses to open it under another. Such a store reads
// a key's versions with a bounded scan instead of a prefix seek. Errors
// wrap ErrCorrupt for an OPTIONS file that does not parse or names a
// comparer this binary does not know.
func storeComparer(fsys vfs.FS, dir string) (*pebble.Comparer, error) {
	desc, err := pebble.Peek(dir, fsys)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return mvccComparer, nil
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, dir, err)
	}
	if !desc.Exists || desc.OptionsFilename == "" {
		return mvccComparer, nil
	}
	f, err := fsys.Open(desc.OptionsFilename)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, desc.OptionsFilename, err)
	}
	text, err := io.ReadAll(f)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, desc.OptionsFilename, err)
	}
	var prev pebble.Options
	err = prev.Parse(string(text), &pebble.ParseHooks{
		NewComparer: func(name string) (*pebble.Comparer, error) {
			if name == mvccComparerName {
				return mvccComparer, nil
			}
			return nil, fmt.Errorf("unknown comparer %q", name)
		},
		// Only the comparer matters here; Pebble checks the rest at open.
		SkipUnknown: func(string, string) bool { return true },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, desc.OptionsFilename, err)
	}
	if prev.Comparer == nil {
		return pebble.DefaultComparer, nil
	}
	return prev.Comparer, nil
}
