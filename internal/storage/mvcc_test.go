package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestMVCCKeyOrderAndRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	prefix := []byte{PrefixState, 9}
	type kv struct {
		key []byte
		ver VersionID
	}
	var items []kv
	alphabet := []byte{0, 1, 'a', 'b', 0xff}
	for i := 0; i < 2000; i++ {
		k := make([]byte, r.IntN(4))
		for j := range k {
			k[j] = alphabet[r.IntN(len(alphabet))]
		}
		items = append(items, kv{k, VersionID{Epoch: uint64(r.IntN(4)), Counter: uint32(r.IntN(3))}})
	}
	encoded := make([][]byte, len(items))
	for i, it := range items {
		encoded[i] = EncodeMVCCKey(prefix, it.key, it.ver)
		key, ver, err := DecodeMVCCKey(prefix, encoded[i])
		if err != nil || !bytes.Equal(key, it.key) || ver != it.ver {
			t.Fatalf("round trip of %q %v = %q %v %v", it.key, it.ver, key, ver, err)
		}
	}
	// Sorting encodings must equal sorting by (key asc, version desc).
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return bytes.Compare(encoded[idx[a]], encoded[idx[b]]) < 0 })
	for n := 1; n < len(idx); n++ {
		p, q := items[idx[n-1]], items[idx[n]]
		c := bytes.Compare(p.key, q.key)
		if c > 0 || (c == 0 && p.ver.Less(q.ver)) {
			t.Fatalf("encoded order puts %q%v before %q%v", p.key, p.ver, q.key, q.ver)
		}
	}
}

func TestMVCCDecodeRejectsGarbage(t *testing.T) {
	prefix := []byte{PrefixState}
	for _, k := range [][]byte{
		{0x7},                             // wrong prefix
		{PrefixState, 'a'},                // unterminated
		{PrefixState, 'a', 0},             // truncated escape
		{PrefixState, 'a', 0, 7},          // bad escape
		{PrefixState, 'a', 0, 1, 1, 2, 3}, // short version
	} {
		if _, _, err := DecodeMVCCKey(prefix, k); !errors.Is(err, ErrBadKey) {
			t.Errorf("DecodeMVCCKey(%x) = %v, want ErrBadKey", k, err)
		}
	}
	for _, v := range [][]byte{{}, {9}, {valueKindTombstone, 1}} {
		if _, _, err := DecodeMVCCValue(v); !errors.Is(err, ErrBadKey) {
			t.Errorf("DecodeMVCCValue(%x) = %v, want ErrBadKey", v, err)
		}
	}
}

func TestGetAndScanAsOf(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prefix := []byte{PrefixState, 3}
	b := e.NewBatch()
	put := func(k string, ep uint64, c uint32, v string, tomb bool) {
		_ = b.Set(EncodeMVCCKey(prefix, []byte(k), VersionID{ep, c}), EncodeMVCCValue([]byte(v), tomb), nil)
	}
	put("a", 1, 1, "a1", false)
	put("a", 3, 1, "a3", false)
	put("b", 2, 1, "b2", false)
	put("b", 4, 2, "", true) // deleted at <4,2>
	put("c", 5, 1, "c5", false)
	put("a\x00", 1, 1, "nul", false)
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	v, ok, newest, err := e.GetMVCC(prefix, []byte("a"), EpochStart(3))
	if err != nil || !ok || string(v.Value) != "a1" || newest != (VersionID{3, 1}) {
		t.Fatalf("Get a as of <3,0> = %q %v newest %v %v", v.Value, ok, newest, err)
	}
	if v, ok, _, _ := e.GetMVCC(prefix, []byte("b"), EpochStart(5)); ok || !v.Tombstone || v.ID != (VersionID{4, 2}) {
		t.Fatalf("b after its tombstone = %+v %v; want the tombstone <4,2>, not visible", v, ok)
	}
	if v, ok, _, _ := e.GetMVCC(prefix, []byte("b"), VersionID{4, 2}); !ok || string(v.Value) != "b2" {
		t.Fatalf("b just below its tombstone = %q %v", v.Value, ok)
	}
	if _, ok, newest, _ := e.GetMVCC(prefix, []byte("zz"), EpochStart(9)); ok || newest != (VersionID{}) {
		t.Fatal("a never-written key has a version")
	}
	var got []string
	err = e.ScanMVCC(prefix, []byte("a"), []byte("d"), EpochStart(5), func(v Version, newest VersionID) bool {
		got = append(got, fmt.Sprintf("%s=%s@%v/%v live=%v", v.Key, v.Value, v.ID, newest, v.Live()))
		return true
	})
	want := []string{"a=a3@<3,1>/<3,1> live=true", "a\x00=nul@<1,1>/<1,1> live=true",
		"b=@<4,2>/<4,2> live=false", "c=@<0,0>/<5,1> live=false"}
	if err != nil || len(got) != len(want) {
		t.Fatalf("scan [a, d) as of <5,0> = %q, %v; want %q", got, err, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("scan [a, d) as of <5,0> = %q; want %q", got, want)
		}
	}
	n := 0
	_ = e.ScanMVCC(prefix, nil, nil, EpochStart(9), func(Version, VersionID) bool { n++; return n < 2 })
	if n != 2 {
		t.Fatalf("scan did not stop when asked (%d calls)", n)
	}
	// The versions in [<2,0>, <5,0>): a3, then b's tombstone and b2 (newest
	// first); a1, a\x00's <1,1> and c5 lie outside the window.
	got = nil
	err = e.ScanVersions(prefix, nil, nil, EpochStart(2), EpochStart(5), false, func(v Version) bool {
		got = append(got, fmt.Sprintf("%s=%s@%v tomb=%v", v.Key, v.Value, v.ID, v.Tombstone))
		return true
	})
	want = []string{"a=a3@<3,1> tomb=false", "b=@<4,2> tomb=true", "b=b2@<2,1> tomb=false"}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("versions in [<2,0>, <5,0>) = %q, %v; want %q", got, err, want)
	}
	n = 0
	_ = e.ScanVersions(prefix, nil, nil, VersionID{}, EpochStart(9), false, func(Version) bool { n++; return false })
	if n != 1 {
		t.Fatalf("ScanVersions did not stop when asked (%d calls)", n)
	}
	// Newest only, and windows that cut inside a key's versions: [<1,1>, <4,2>)
	// holds a3 (a's newest there), a\x00's <1,1> and b2; b's tombstone is at
	// the window's end, excluded.
	got = nil
	err = e.ScanVersions(prefix, nil, nil, VersionID{1, 1}, VersionID{4, 2}, true, func(v Version) bool {
		got = append(got, fmt.Sprintf("%s=%s@%v", v.Key, v.Value, v.ID))
		return true
	})
	want = []string{"a=a3@<3,1>", "a\x00=nul@<1,1>", "b=b2@<2,1>"}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("newest versions in [<1,1>, <4,2>) = %q, %v; want %q", got, err, want)
	}
	if err := e.ScanVersions(prefix, nil, nil, EpochStart(5), EpochStart(5), false, func(Version) bool { t.Fatal("a version in an empty window"); return false }); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecodeMVCCKey(f *testing.F) {
	prefix := []byte{PrefixState, 1}
	f.Add(EncodeMVCCKey(prefix, []byte("key"), VersionID{7, 3}))
	f.Add(EncodeMVCCKey(prefix, []byte{0, 0xff, 0}, VersionID{}))
	f.Add([]byte{PrefixState, 1, 0})
	f.Fuzz(func(t *testing.T, k []byte) {
		key, ver, err := DecodeMVCCKey(prefix, k)
		if err != nil {
			return
		}
		if again := EncodeMVCCKey(prefix, key, ver); !bytes.Equal(again, k) {
			t.Fatalf("decode(%x) re-encodes as %x", k, again)
		}
	})
}

func FuzzDecodeMVCCValue(f *testing.F) {
	f.Add(EncodeMVCCValue([]byte("v"), false))
	f.Add(EncodeMVCCValue(nil, true))
	f.Fuzz(func(t *testing.T, v []byte) {
		val, tomb, err := DecodeMVCCValue(v)
		if err == nil && !bytes.Equal(EncodeMVCCValue(val, tomb), v) {
			t.Fatalf("decode(%x) re-encodes differently", v)
		}
	})
}

// TestNewestVersionIsGetMVCCs: NewestVersion returns what GetMVCC reports
// as a key's newest version, tombstones included, for keys that are
// prefixes of others, hold a NUL byte, or were never written, under two
// key spaces that share a prefix byte.
func TestNewestVersionIsGetMVCCs(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prefix, other := []byte{PrefixState, 3}, []byte{PrefixState, 3, 0}
	b := e.NewBatch()
	put := func(p []byte, k string, ep uint64, c uint32, tomb bool) {
		_ = b.Set(EncodeMVCCKey(p, []byte(k), VersionID{ep, c}), EncodeMVCCValue([]byte("v"), tomb), nil)
	}
	put(prefix, "a", 1, 1, false)
	put(prefix, "a", 3, 2, false)
	put(prefix, "ab", 9, 1, false) // "a" is its prefix
	put(prefix, "b", 2, 1, false)
	put(prefix, "b", 4, 2, true) // deleted: the tombstone is the newest
	put(prefix, "a\x00", 7, 1, false)
	put(prefix, "\x00", 5, 5, false)
	put(other, "c", 8, 1, false)
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want VersionID
		ok   bool
	}{
		{"a", VersionID{3, 2}, true},
		{"ab", VersionID{9, 1}, true},
		{"b", VersionID{4, 2}, true},
		{"a\x00", VersionID{7, 1}, true},
		{"\x00", VersionID{5, 5}, true},
		{"c", VersionID{}, false}, // only under the other prefix
		{"", VersionID{}, false},
		{"zz", VersionID{}, false},
	} {
		got, ok, err := e.NewestVersion(prefix, []byte(tc.key))
		_, _, viaGet, gerr := e.GetMVCC(prefix, []byte(tc.key), VersionID{Epoch: ^uint64(0), Counter: ^uint32(0)})
		if err != nil || gerr != nil || got != tc.want || ok != tc.ok || got != viaGet {
			t.Errorf("NewestVersion(%q) = %v %v %v; want %v %v (GetMVCC's newest %v %v)", tc.key, got, ok, err, tc.want, tc.ok, viaGet, gerr)
		}
	}
}
