package storage

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzNextRecord: snapshot framing never panics, and what it parses
// re-frames to exactly the bytes it consumed.
func FuzzNextRecord(f *testing.F) {
	f.Add(AppendRecord(AppendRecord(nil, []byte("a")), nil))
	f.Add([]byte{0, 0, 0, 9, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var again []byte
		rest := data
		for len(rest) > 0 {
			rec, next, err := NextRecord(rest)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("NextRecord error %v is not ErrCorrupt", err)
				}
				return
			}
			again, rest = AppendRecord(again, rec), next
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-framed %x as %x", data, again)
		}
	})
}

// FuzzVersionOrder: the MVCC key encoding sorts versions of one key newest
// first and keeps keys apart, for any keys and version ids.
func FuzzVersionOrder(f *testing.F) {
	f.Add([]byte("k"), uint64(3), uint32(1), uint64(3), uint32(2))
	f.Add([]byte{0, 0xff}, uint64(0), uint32(0), ^uint64(0), ^uint32(0))
	prefix := []byte{PrefixState, 2}
	f.Fuzz(func(t *testing.T, key []byte, e1 uint64, c1 uint32, e2 uint64, c2 uint32) {
		v1, v2 := VersionID{e1, c1}, VersionID{e2, c2}
		k1, k2 := EncodeMVCCKey(prefix, key, v1), EncodeMVCCKey(prefix, key, v2)
		if v1.Less(v2) != (bytes.Compare(k2, k1) < 0) && v1 != v2 {
			t.Fatalf("%v < %v is %v, but the encodings compare %d", v1, v2, v1.Less(v2), bytes.Compare(k1, k2))
		}
		// The key part (all but the 12-byte version) is prefix-free, so all
		// versions of a key sort together: no other key's part extends it.
		part := func(k []byte) []byte { enc := EncodeMVCCKey(prefix, k, v1); return enc[:len(enc)-12] }
		for _, other := range [][]byte{append(append([]byte{}, key...), 0), append(append([]byte{}, key...), 0xff), append(append([]byte{}, key...), 1)} {
			if bytes.HasPrefix(part(other), part(key)) {
				t.Fatalf("key %x's encoding is a prefix of key %x's", key, other)
			}
		}
	})
}
