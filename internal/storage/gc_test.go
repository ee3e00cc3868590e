package storage

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

var gcPrefix = []byte{PrefixData}

// writeVersions writes versions of keys: each entry "key@epoch=value",
// "key@epoch=-" for a tombstone.
func writeVersions(t *testing.T, e *Engine, entries ...string) {
	t.Helper()
	b := e.NewBatch()
	for _, s := range entries {
		key, rest, _ := strings.Cut(s, "@")
		ep, val, _ := strings.Cut(rest, "=")
		var epoch uint64
		if _, err := fmt.Sscan(ep, &epoch); err != nil {
			t.Fatal(err)
		}
		if err := b.Set(EncodeMVCCKey(gcPrefix, []byte(key), VersionID{Epoch: epoch, Counter: 1}), EncodeMVCCValue([]byte(val), val == "-"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
}

// versions renders every stored version in key order.
func versions(t *testing.T, e *Engine) string {
	t.Helper()
	var out []string
	err := e.Scan(gcPrefix, PrefixEnd(gcPrefix), func(k, v []byte) (bool, error) {
		key, ver, err := DecodeMVCCKey(gcPrefix, k)
		if err != nil {
			return false, err
		}
		val, tomb, err := DecodeMVCCValue(v)
		if tomb {
			val = []byte("-")
		}
		out = append(out, fmt.Sprintf("%s@%d=%s", key, ver.Epoch, val))
		return true, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, " ")
}

// collect runs CollectMVCC over the whole key space and commits it.
func collect(t *testing.T, e *Engine, horizon uint64, maxKeys int) (GCStats, []byte) {
	t.Helper()
	b := e.NewBatch()
	stats, resume, err := e.CollectMVCC(b, gcPrefix, nil, nil, EpochStart(horizon), maxKeys)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	return stats, resume
}

func TestCollectKeepsWhatAReadAtOrAboveTheHorizonSees(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	writeVersions(t, e,
		"a@3=a3", "a@5=a5", "a@8=a8", "a@12=a12", // a's newest below 10 (8) stays
		"b@2=b2", "b@4=-", // a tombstone newest below the horizon: b goes entirely
		"c@3=c3", "c@6=-", "c@11=c11", // c's tombstone hides nothing once c@3 goes
		"d@10=d10", "d@11=d11", // nothing below the horizon
		"e@9=e9") // one version: kept
	stats, resume := collect(t, e, 10, 0)
	if got, want := versions(t, e), "a@12=a12 a@8=a8 c@11=c11 d@11=d11 d@10=d10 e@9=e9"; got != want {
		t.Fatalf("after collecting below 10:\n got %s\nwant %s", got, want)
	}
	if stats.Keys != 5 || stats.Versions != 6 || stats.Bytes <= 0 || resume != nil {
		t.Fatalf("stats %+v, resume %q; want 5 keys, 6 versions, no resume", stats, resume)
	}
	// Collecting again at the same horizon finds nothing.
	if stats, _ := collect(t, e, 10, 0); stats.Versions != 0 {
		t.Fatalf("a second pass deleted %d versions", stats.Versions)
	}
}

func TestCollectResumesWhereItStopped(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	writeVersions(t, e, "a@1=x", "a@2=y", "b@1=x", "b@2=y", "c@1=x", "c@2=y")
	b := e.NewBatch()
	stats, resume, err := e.CollectMVCC(b, gcPrefix, nil, nil, EpochStart(5), 2)
	if err != nil || stats.Keys != 2 || stats.Versions != 2 || string(resume) != "c" {
		t.Fatalf("first pass: %+v, resume %q, %v; want 2 keys and resume at c", stats, resume, err)
	}
	stats, resume, err = e.CollectMVCC(b, gcPrefix, resume, nil, EpochStart(5), 2)
	if err != nil || stats.Keys != 1 || stats.Versions != 1 || resume != nil {
		t.Fatalf("second pass: %+v, resume %q, %v; want 1 key, done", stats, resume, err)
	}
	if err := e.Commit(b, true); err != nil {
		t.Fatal(err)
	}
	if got, want := versions(t, e), "a@2=y b@2=y c@2=y"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestCollectNeverChangesAReadAtOrAboveTheHorizon: over random histories,
// every read at every epoch from the horizon on returns the same before and
// after collection, and every key keeps at most one version below it —
// with point deletions and with range deletions (keys with many versions),
// among keys that are prefixes of each other (k1, k10, k11).
func TestCollectNeverChangesAReadAtOrAboveTheHorizon(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	const keys, epochs = 12, 60
	ranged := 0
	for round := range 40 {
		e, err := Open(t.TempDir(), 1)
		if err != nil {
			t.Fatal(err)
		}
		var entries []string
		for k := range keys {
			for ep := uint64(1); ep <= epochs; ep++ {
				switch r.IntN(4) {
				case 0:
					entries = append(entries, fmt.Sprintf("k%d@%d=v%d", k, ep, ep))
				case 1:
					if r.IntN(3) == 0 {
						entries = append(entries, fmt.Sprintf("k%d@%d=-", k, ep))
					}
				}
			}
		}
		writeVersions(t, e, entries...)
		horizon := uint64(1 + r.IntN(epochs+2))
		reads := func() string {
			var out []string
			for ep := horizon; ep <= epochs+2; ep++ {
				for k := range keys {
					v, ok, _, err := e.GetMVCC(gcPrefix, []byte(fmt.Sprintf("k%d", k)), EpochStart(ep))
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, fmt.Sprintf("%d:k%d=%v:%s", ep, k, ok, v.Value))
				}
			}
			return strings.Join(out, " ")
		}
		before := reads()
		s1, _ := collect(t, e, horizon, 1+r.IntN(3)) // one bounded pass, then the rest
		s2, _ := collect(t, e, horizon, 0)
		ranged += s1.RangeDeletes + s2.RangeDeletes
		if after := reads(); after != before {
			t.Fatalf("round %d, horizon %d: reads changed\nbefore %s\nafter  %s", round, horizon, before, after)
		}
		below := map[string]int{}
		for _, v := range strings.Fields(versions(t, e)) {
			key, rest, _ := strings.Cut(v, "@")
			var ep uint64
			fmt.Sscan(strings.SplitN(rest, "=", 2)[0], &ep)
			if ep < horizon {
				if below[key]++; below[key] > 1 {
					t.Fatalf("round %d: %s keeps two versions below horizon %d: %s", round, key, horizon, versions(t, e))
				}
			}
		}
		e.Close()
	}
	if ranged == 0 {
		t.Fatal("no key was collected by a range deletion: the test shows nothing of them")
	}
	t.Logf("%d keys collected by a range deletion", ranged)
}

// GC tells a tombstone by its value's length alone (tombstoneLen): the
// constant must be what EncodeMVCCValue writes, and no put is that short.
func TestTombstoneLenIsATombstonesEncoding(t *testing.T) {
	if got := len(EncodeMVCCValue(nil, true)); got != tombstoneLen {
		t.Fatalf("a tombstone's value is %d bytes, tombstoneLen %d", got, tombstoneLen)
	}
	if got := len(EncodeMVCCValue([]byte("x"), false)); got <= tombstoneLen {
		t.Fatalf("a 1-byte put's value is %d bytes, not longer than a tombstone's", got)
	}
}
