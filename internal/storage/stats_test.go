package storage

import "testing"

// TestMVCCStatsCountsEveryVersionAndTheNewest: versions and bytes of the
// whole history, and of each key's newest version, which GC then leaves.
func TestMVCCStatsCountsEveryVersionAndTheNewest(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	writeVersions(t, e, "a@1=xx", "a@2=yy", "a@3=zz", "b@1=x", "b@4=-")
	s, err := e.MVCCStats(gcPrefix)
	if err != nil {
		t.Fatal(err)
	}
	one := int64(len(EncodeMVCCKey(gcPrefix, []byte("a"), VersionID{Epoch: 1, Counter: 1})))
	wantNewest := (one + int64(len(EncodeMVCCValue([]byte("zz"), false)))) + (one + int64(len(EncodeMVCCValue(nil, true))))
	if s.Keys != 2 || s.Versions != 5 || s.NewestBytes != wantNewest || s.Bytes <= s.NewestBytes {
		t.Fatalf("stats %+v; want 2 keys, 5 versions, newest bytes %d", s, wantNewest)
	}
	collect(t, e, 10, 0) // a keeps a@3; b's newest is a tombstone: gone
	if s, _ := e.MVCCStats(gcPrefix); s.Keys != 1 || s.Versions != 1 || s.Bytes != s.NewestBytes {
		t.Fatalf("after GC: %+v; want a's newest alone", s)
	}
}
