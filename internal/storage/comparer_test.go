package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSplitMVCCKeepsPebblesOrder: on every pair of keys, MVCC-shaped or
// not, splitMVCC keeps the properties Pebble requires of a Split under a
// bytewise order (a key's prefix sorts before it, prefixes order keys, and
// suffixes order keys of one prefix), checked on random keys over the
// bytes that matter (0x00, 0x01, the MVCC spaces' bytes, 0xff) and on real
// MVCC keys and their bounds. (Pebble's CheckComparer also asks that a
// prefix stripped of leading bytes split the same way, which only its
// synthetic prefixes need, on externally ingested files; stores never use
// them.)
func TestSplitMVCCKeepsPebblesOrder(t *testing.T) {
	if err := checkSplit(splitMVCC); err != nil {
		t.Fatal(err)
	}
}

// checkSplit checks split's properties on adversarial keys: nil when they
// hold, else the first pair that breaks one.
func checkSplit(split func([]byte) int) error {
	rng := rand.New(rand.NewPCG(17, 23))
	alphabet := []byte{0x00, 0x01, 0x02, PrefixData, PrefixRegional, 0xff}
	var keys [][]byte
	for range 500 {
		k := make([]byte, rng.IntN(20))
		for i := range k {
			k[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if len(k) > 0 && rng.IntN(2) == 0 {
			k[0] = PrefixData
		}
		keys = append(keys, k)
	}
	for _, uk := range []string{"", "k", "k\x00", "\x00\x00\x01", "kk\x01\x00"} {
		v := VersionID{Epoch: rng.Uint64(), Counter: rng.Uint32()}
		key := EncodeMVCCKey([]byte{PrefixData}, []byte(uk), v)
		lo, hi := MVCCKeyBounds([]byte{PrefixData}, []byte(uk), []byte(uk+"z"))
		keys = append(keys, key, lo, hi, appendEscaped([]byte{PrefixData}, []byte(uk)))
		// A bound whose own bytes end 14 bytes short of a terminator: a split
		// that looks only at a key's tail takes it for an MVCC key.
		keys = append(keys, append(appendEscaped([]byte{PrefixData}, []byte(uk)), bytes.Repeat([]byte{0x7f}, versionLen)...))
		keys = append(keys, append([]byte{PrefixData, 0, 1}, bytes.Repeat([]byte{0x02}, versionLen)...))
	}
	for _, a := range keys {
		pa := a[:split(a)]
		if len(pa) < len(a) && bytes.Compare(pa, a) >= 0 {
			return fmt.Errorf("key %x: its prefix %x does not sort before it", a, pa)
		}
		for _, b := range keys {
			pb := b[:split(b)]
			c, cp := bytes.Compare(a, b), bytes.Compare(pa, pb)
			if c <= 0 && cp > 0 {
				return fmt.Errorf("keys %x ≤ %x, but their prefixes %x > %x", a, b, pa, pb)
			}
			if cp == 0 && c != bytes.Compare(a[len(pa):], b[len(pb):]) {
				return fmt.Errorf("keys %x, %x share a prefix, but their suffixes order them otherwise", a, b)
			}
		}
	}
	return nil
}

// TestCheckSplitBites: checkSplit refuses a split that takes any key
// ending in a terminator and 12 bytes for an MVCC key.
func TestCheckSplitBites(t *testing.T) {
	byTail := func(k []byte) int {
		n := len(k) - versionLen
		if n >= 3 && (k[0] == PrefixData || k[0] == PrefixRegional) && k[n-2] == 0 && k[n-1] == 1 {
			return n
		}
		return len(k)
	}
	if err := checkSplit(byTail); err == nil {
		t.Fatal("checkSplit passed a split by the key's tail")
	} else {
		t.Log(err)
	}
}

// TestSplitMVCCCutsAfterTheUserKey: an MVCC key's prefix is its space
// byte and escaped, terminated user key, whatever the user key's bytes;
// a key of another space is its own prefix.
func TestSplitMVCCCutsAfterTheUserKey(t *testing.T) {
	for _, uk := range []string{"", "user", "a\x00\x01b", "\x00", "\x01\x00\x01"} {
		for _, space := range []byte{PrefixData, PrefixRegional} {
			k := EncodeMVCCKey([]byte{space}, []byte(uk), VersionID{Epoch: 0x0001000100010001, Counter: 0x00010001})
			if got, want := splitMVCC(k), len(appendEscaped([]byte{space}, []byte(uk))); got != want {
				t.Errorf("space %d, user key %q: split at %d, want %d", space, uk, got, want)
			}
		}
	}
	raft := binary.BigEndian.AppendUint64([]byte{PrefixRaft, 0, 1}, 1)
	if got := splitMVCC(raft); got != len(raft) {
		t.Errorf("a Raft key split at %d of %d", got, len(raft))
	}
}

// TestPointReadsSkipTablesByTheirFilters: a new store splits MVCC keys, so
// GetMVCC and NewestVersion of a key find its versions with a prefix seek
// that the tables' bloom filters answer: reads of keys a table spans but
// lacks are answered by its filter (Pebble counts a hit), and reads of keys
// it has return the same versions as ever. It fails if the reads scan
// instead ("0 of 100 reads of absent keys answered by a filter").
func TestPointReadsSkipTablesByTheirFilters(t *testing.T) {
	e, err := Open(filepath.Join(t.TempDir(), "store"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if !e.prefixSeek || e.opts.Comparer.Name != mvccComparerName {
		t.Fatalf("a new store opened under comparer %q (prefix seeks %v)", e.opts.Comparer.Name, e.prefixSeek)
	}
	prefix := []byte{PrefixData}
	key := func(i int) []byte { return fmt.Appendf(nil, "k%03d", i) }
	// Even keys, two versions each, flushed to tables that span the odd ones.
	b := e.NewBatch()
	for i := 0; i < 200; i += 2 {
		for epoch := uint64(1); epoch <= 2; epoch++ {
			_ = b.Set(EncodeMVCCKey(prefix, key(i), VersionID{Epoch: epoch, Counter: 1}), EncodeMVCCValue(fmt.Appendf(key(i), "@%d", epoch), false), nil)
		}
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Flush(); err != nil {
		t.Fatal(err)
	}
	before := e.Metrics().Filter
	for i := 1; i < 100; i += 2 {
		if v, ok, newest, err := e.GetMVCC(prefix, key(i), EpochStart(9)); err != nil || ok || newest != (VersionID{}) {
			t.Fatalf("GetMVCC(%s), absent = %+v %v %v %v", key(i), v, ok, newest, err)
		}
		if id, ok, err := e.NewestVersion(prefix, key(i)); err != nil || ok {
			t.Fatalf("NewestVersion(%s), absent = %v %v %v", key(i), id, ok, err)
		}
	}
	hits := e.Metrics().Filter.Hits - before.Hits
	for i := 0; i < 100; i += 2 {
		v, ok, newest, err := e.GetMVCC(prefix, key(i), EpochStart(2))
		if err != nil || !ok || string(v.Value) != string(key(i))+"@1" || newest != (VersionID{Epoch: 2, Counter: 1}) {
			t.Fatalf("GetMVCC(%s) below epoch 2 = %+v %v %v %v, want its epoch 1 version, newest epoch 2", key(i), v, ok, newest, err)
		}
		if id, ok, err := e.NewestVersion(prefix, key(i)); err != nil || !ok || id != newest {
			t.Fatalf("NewestVersion(%s) = %v %v %v, want %v", key(i), id, ok, err, newest)
		}
	}
	// About 1% of absent keys pass a 10-bit filter, and a plain build's reads
	// consult it every time. Under the race detector Pebble's invariant
	// checks take other iterator paths at random (34 to 100 of 100 in 40
	// runs), so there the filters need only be used.
	want := int64(90)
	if raceEnabled {
		want = 1
	}
	if hits < want {
		t.Fatalf("%d of 100 reads of absent keys answered by a filter, want at least %d (misses %d)", hits, want, e.Metrics().Filter.Misses-before.Misses)
	}
	t.Logf("%d of 100 reads of absent keys answered by a filter", hits)
}

// TestAStoreUnderTheDefaultComparerStillOpens: a store created before the
// MVCC comparer (under Pebble's default, without filters) opens under its
// own comparer, reads its versions with bounded scans, takes new writes,
// and opens again; a new store keeps the MVCC comparer across reopens.
func TestAStoreUnderTheDefaultComparerStillOpens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "old")
	cache := pebble.NewCache(MinCacheSize)
	o := pebbleOptions(vfs.Default, cache, pebble.DefaultComparer)
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = pebble.NoFilterPolicy
	}
	db, err := pebble.Open(dir, o)
	cache.Unref()
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte{PrefixData}
	b := db.NewBatch()
	_ = b.Set(storeIdentKey, binary.BigEndian.AppendUint64(nil, 1), nil)
	_ = b.Set(layoutVersionKey, binary.BigEndian.AppendUint32(nil, LayoutVersion), nil)
	_ = b.Set(EncodeMVCCKey(prefix, []byte("k"), VersionID{Epoch: 3, Counter: 1}), EncodeMVCCValue([]byte("old"), false), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		e, err := Open(dir, 1)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if e.prefixSeek || e.opts.Comparer.Name != pebble.DefaultComparer.Name {
			t.Fatalf("round %d: the old store opened under %q (prefix seeks %v)", round, e.opts.Comparer.Name, e.prefixSeek)
		}
		nb := e.NewBatch()
		_ = nb.Set(EncodeMVCCKey(prefix, []byte("k"), VersionID{Epoch: uint64(4 + round), Counter: 1}), EncodeMVCCValue([]byte("new"), false), nil)
		if err := e.Commit(nb, true); err != nil {
			t.Fatal(err)
		}
		v, ok, newest, err := e.GetMVCC(prefix, []byte("k"), EpochStart(4))
		if err != nil || !ok || string(v.Value) != "old" || newest.Epoch != uint64(4+round) {
			t.Fatalf("round %d: GetMVCC = %+v %v %v %v", round, v, ok, newest, err)
		}
		if id, ok, err := e.NewestVersion(prefix, []byte("k")); err != nil || !ok || id != newest {
			t.Fatalf("round %d: NewestVersion = %v %v %v", round, id, ok, err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fresh := filepath.Join(t.TempDir(), "new")
	for round := range 2 {
		e, err := Open(fresh, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !e.prefixSeek {
			t.Fatalf("round %d: a new store opened under %q", round, e.opts.Comparer.Name)
		}
		_ = e.Close()
	}
}
