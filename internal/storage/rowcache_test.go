package storage

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// uncached reads as e does with no newest-version cache: Pebble's answer.
func uncached(e *Engine) *Engine {
	plain := *e
	plain.rows = nil
	return &plain
}

// TestRowCacheFollowsEveryWrite runs random writes of every kind a store
// sees over its MVCC data (new versions, tombstones, a version below the
// newest, GC's point deletions of old versions, a replica's range
// deletion, an ingested snapshot) and
// after each checks that every key reads, at every bound, what Pebble
// itself answers, while the reads hit the cache.
func TestRowCacheFollowsEveryWrite(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	plain := uncached(e)
	prefixes := [][]byte{{PrefixData}, {PrefixRegional}}
	keys := []string{"a", "b", "c", "a\x00", "d"}
	rng := rand.New(rand.NewPCG(1, 2))
	var epoch uint64 = 1
	versions := map[string][]VersionID{} // per prefix+key, oldest first
	hits0 := 0
	for step := range 400 {
		p := prefixes[rng.IntN(2)]
		k := keys[rng.IntN(len(keys))]
		id := string(p) + k
		switch op := rng.IntN(20); {
		case op < 12: // a new version, sometimes a tombstone, sometimes two keys in one batch
			b := e.NewBatch()
			epoch++
			v := VersionID{Epoch: epoch, Counter: 1}
			_ = b.Set(EncodeMVCCKey(p, []byte(k), v), EncodeMVCCValue([]byte(fmt.Sprintf("v%d", step)), op == 0), nil)
			versions[id] = append(versions[id], v)
			if op%3 == 0 {
				k2 := keys[rng.IntN(len(keys))]
				_ = b.Set(EncodeMVCCKey(p, []byte(k2), v), EncodeMVCCValue([]byte("second"), false), nil)
				versions[string(p)+k2] = append(versions[string(p)+k2], v)
			}
			if err := e.Commit(b, false); err != nil {
				t.Fatal(err)
			}
		case op == 12: // a version below the key's newest (the newest stays)
			vs := versions[id]
			if len(vs) == 0 || vs[0].Epoch < 2 {
				continue
			}
			v := VersionID{Epoch: vs[0].Epoch - 1, Counter: 9}
			b := e.NewBatch()
			_ = b.Set(EncodeMVCCKey(p, []byte(k), v), EncodeMVCCValue([]byte("older"), false), nil)
			versions[id] = append([]VersionID{v}, vs...)
			if err := e.Commit(b, false); err != nil {
				t.Fatal(err)
			}
		case op < 15: // GC: delete a key's versions from the oldest, the newest too at times
			vs := versions[id]
			if len(vs) == 0 {
				continue
			}
			n := 1 + rng.IntN(len(vs))
			b := e.NewBatch()
			for _, v := range vs[:n] {
				_ = b.Delete(EncodeMVCCKey(p, []byte(k), v), nil)
			}
			versions[id] = vs[n:]
			if err := e.Commit(b, false); err != nil {
				t.Fatal(err)
			}
		case op < 17: // a replica removed: its span's data deleted
			lo, hi := MVCCKeyBounds(p, []byte("b"), []byte("d"))
			b := e.NewBatch()
			_ = b.DeleteRange(lo, hi, nil)
			for _, kk := range keys {
				if kk >= "b" && kk < "d" {
					delete(versions, string(p)+kk)
				}
			}
			if err := e.Commit(b, false); err != nil {
				t.Fatal(err)
			}
		default: // a snapshot ingested: a span's data replaced
			lo, hi := MVCCKeyBounds(p, []byte("a"), []byte("b"))
			epoch++
			v := VersionID{Epoch: epoch, Counter: 7}
			ingestSST(t, e, lo, hi, map[string]string{string(EncodeMVCCKey(p, []byte("a"), v)): string(EncodeMVCCValue([]byte("ingested"), false))})
			versions[string(p)+"a"] = []VersionID{v}
			delete(versions, string(p)+"a\x00")
		}
		for _, p := range prefixes {
			for _, k := range keys {
				for _, below := range []VersionID{{Epoch: ^uint64(0)}, EpochStart(epoch), EpochStart(epoch / 2)} {
					v, ok, newest, err := e.GetMVCC(p, []byte(k), below)
					wv, wok, wnewest, werr := plain.GetMVCC(p, []byte(k), below)
					if err != nil || werr != nil || ok != wok || newest != wnewest || v.ID != wv.ID || v.Tombstone != wv.Tombstone || string(v.Value) != string(wv.Value) {
						t.Fatalf("step %d: GetMVCC(%x, %q, %v) = %+v %v %v %v; Pebble says %+v %v %v %v", step, p, k, below, v, ok, newest, err, wv, wok, wnewest, werr)
					}
				}
				got, ok, err := e.NewestVersion(p, []byte(k))
				want, wok, werr := plain.NewestVersion(p, []byte(k))
				if err != nil || werr != nil || got != want || ok != wok {
					t.Fatalf("step %d: NewestVersion(%x, %q) = %v %v %v; Pebble says %v %v %v", step, p, k, got, ok, err, want, wok, werr)
				}
			}
		}
		hits0 = max(hits0, e.rows.len())
	}
	if hits0 == 0 {
		t.Fatal("the cache never held an entry: the test checked Pebble against itself")
	}
}

// TestRowCacheKeepsNoAnswerOlderThanAWrite: a read that began before a
// write to its shard must not leave its answer behind, and an
// id-only entry does not replace a full one.
func TestRowCacheKeepsNoAnswerOlderThanAWrite(t *testing.T) {
	c := newRowCache(1 << 20)
	key := []byte{PrefixData, 'k', 0, 1}
	_, _, gen := c.get(key)
	c.written(key, VersionID{2, 1}, EncodeMVCCValue([]byte("new"), false)) // a commit of the key lands while the read runs
	c.put(key, rowEntry{id: VersionID{1, 1}, full: true, value: []byte("old")}, gen)
	if _, ok, _ := c.get(key); ok {
		t.Fatal("a read that raced a write left its answer in the cache")
	}
	_, _, gen = c.get(key)
	c.put(key, rowEntry{id: VersionID{2, 1}, full: true, value: []byte("new")}, gen)
	c.put(key, rowEntry{id: VersionID{2, 1}}, gen)
	if e, ok, _ := c.get(key); !ok || !e.full || string(e.value) != "new" {
		t.Fatalf("entry %+v %v; want the full one kept", e, ok)
	}
	c.clear()
	if c.len() != 0 {
		t.Fatal("clear left entries")
	}
}

// TestRowCacheStaysWithinItsBudget fills a small cache and checks that it
// evicts rather than grows, and keeps no value above rowCacheMaxValue.
func TestRowCacheStaysWithinItsBudget(t *testing.T) {
	const budget = 64 << 10
	c := newRowCache(budget)
	for i := range 10000 {
		key := fmt.Appendf([]byte{PrefixData}, "key%05d\x00\x01", i)
		_, _, gen := c.get(key)
		c.put(key, rowEntry{id: VersionID{1, 1}, full: true, value: make([]byte, 100)}, gen)
	}
	var bytes int64
	for i := range c.shards {
		bytes += c.shards[i].bytes
	}
	if bytes > budget || c.len() == 0 || c.len() >= 10000 {
		t.Fatalf("%d entries of %d bytes in a %d-byte cache", c.len(), bytes, budget)
	}
	big := []byte{PrefixData, 'b', 0, 1}
	_, _, gen := c.get(big)
	c.put(big, rowEntry{id: VersionID{1, 1}, full: true, value: make([]byte, rowCacheMaxValue+1)}, gen)
	if _, ok, _ := c.get(big); ok {
		t.Fatal("a value above rowCacheMaxValue was kept")
	}
}

// TestRowCacheReadsFollowCommitsUnderConcurrency: writers commit ever
// newer versions of a few keys while readers read them; a read that starts
// after a commit returned must see that version or a newer one (a stale
// entry would show an older one). Run with -race.
func TestRowCacheReadsFollowCommitsUnderConcurrency(t *testing.T) {
	e, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prefix := []byte{PrefixData}
	const nkeys, writes = 4, 300
	var committed [nkeys]atomic.Uint64 // the newest epoch whose commit returned, per key
	var wg sync.WaitGroup
	var stale atomic.Value
	done := make(chan struct{})
	for k := range nkeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ep := uint64(1); ep <= writes; ep++ {
				b := e.NewBatch()
				_ = b.Set(EncodeMVCCKey(prefix, []byte{'k', byte(k)}, VersionID{ep, 1}), EncodeMVCCValue(fmt.Appendf(nil, "%d", ep), false), nil)
				if err := e.Commit(b, false); err != nil {
					stale.Store(err.Error())
					return
				}
				committed[k].Store(ep)
			}
		}()
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				k := (i + r) % nkeys
				floor := committed[k].Load()
				var got uint64
				if i%2 == 0 {
					v, _, _, err := e.GetMVCC(prefix, []byte{'k', byte(k)}, VersionID{Epoch: ^uint64(0)})
					if err != nil {
						stale.Store(err.Error())
						return
					}
					if v.ID.Epoch != 0 && string(v.Value) != fmt.Sprint(v.ID.Epoch) {
						stale.Store(fmt.Sprintf("key %d: version %v holds %q", k, v.ID, v.Value))
					}
					got = v.ID.Epoch
				} else {
					v, _, err := e.NewestVersion(prefix, []byte{'k', byte(k)})
					if err != nil {
						stale.Store(err.Error())
						return
					}
					got = v.Epoch
				}
				if got < floor {
					stale.Store(fmt.Sprintf("key %d: read epoch %d after the commit of %d returned", k, got, floor))
				}
			}
		}()
	}
	for k := range nkeys {
		for committed[k].Load() < writes {
			if s := stale.Load(); s != nil {
				break
			}
			runtime.Gosched()
		}
	}
	close(done)
	wg.Wait()
	if s := stale.Load(); s != nil {
		t.Fatal(s)
	}
}
