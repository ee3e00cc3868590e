package client_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startCluster(t *testing.T, opts localcluster.Options) (*localcluster.Cluster, *client.DB) {
	t.Helper()
	c := localcluster.StartT(t, "../examples/one-region.yaml", opts)
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	return c, db
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// retry runs f until it succeeds, while it fails in a way a loaded machine
// explains (retryable, or with its outcome unknown: each f is idempotent),
// until ctx ends; any other failure fails the test, as what.
func retry(t *testing.T, ctx context.Context, what string, f func() error) {
	t.Helper()
	for {
		err := f()
		if err == nil {
			return
		}
		if ctx.Err() != nil || !client.IsRetryable(err) && !errors.Is(err, client.ErrCommitUnknown) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestPutGetScanDeleteAcrossRanges(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	// "a…" keys live in range [,m), "x…" keys in [m,): a two-range transaction.
	err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for _, k := range []string{"apple", "avocado", "xray", "yak"} {
			if err := tx.Put(ctx, []byte(k), []byte("v-"+k)); err != nil {
				return err
			}
		}
		// Read your own writes, before commit.
		v, ok, err := tx.Get(ctx, []byte("xray"))
		if err != nil || !ok || string(v) != "v-xray" {
			t.Errorf("own write read back as %q %v %v", v, ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tx := db.Begin()
	kvs, err := tx.Scan(ctx, []byte("a"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range kvs {
		keys = append(keys, string(kv.Key))
	}
	if want := "apple avocado xray yak"; joined(keys) != want {
		t.Fatalf("scan = %q, want %q", joined(keys), want)
	}
	if kvs, _ := tx.Scan(ctx, []byte("a"), nil, 3); len(kvs) != 3 || string(kvs[2].Key) != "xray" {
		t.Fatalf("scan with limit 3 = %v", kvs)
	}
	if err := tx.Delete(ctx, []byte("apple")); err != nil {
		t.Fatal(err)
	}
	if kvs, _ := tx.Scan(ctx, []byte("a"), []byte("b"), 0); len(kvs) != 1 || string(kvs[0].Key) != "avocado" {
		t.Fatalf("scan after buffered delete = %v", kvs)
	}
	ver, err := tx.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ver.Epoch == 0 {
		t.Fatalf("commit version %v has no epoch", ver)
	}
	check := db.Begin()
	if _, ok, err := check.Get(ctx, []byte("apple")); ok || err != nil {
		t.Fatalf("deleted key still visible (%v, %v)", ok, err)
	}
	if v, ok, _ := check.Get(ctx, []byte("yak")); !ok || string(v) != "v-yak" {
		t.Fatalf("yak = %q %v", v, ok)
	}
	if _, err := check.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func joined(s []string) string {
	var b bytes.Buffer
	for i, x := range s {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(x)
	}
	return b.String()
}

func TestBadInputIsTyped(t *testing.T) {
	_, db := startCluster(t, localcluster.Options{})
	ctx := ctxT(t, 30*time.Second)
	tx := db.Begin()
	for name, c := range map[string]struct {
		err  error
		want error
	}{
		"empty key get":   {func() error { _, _, err := tx.Get(ctx, nil); return err }(), client.ErrEmptyKey},
		"empty key put":   {tx.Put(ctx, []byte{}, []byte("v")), client.ErrEmptyKey},
		"key too large":   {tx.Put(ctx, make([]byte, client.MaxKeySize+1), nil), client.ErrKeyTooLarge},
		"value too large": {tx.Put(ctx, []byte("k"), make([]byte, client.MaxValueSize+1)), client.ErrValueTooLarge},
		"inverted range":  {func() error { _, err := tx.Scan(ctx, []byte("z"), []byte("a"), 0); return err }(), client.ErrInvalidRange},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", name, c.err, c.want)
		}
	}
	// A rejected write loses nothing: the transaction still commits its good write.
	if err := tx.Put(ctx, []byte("good"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Commit(ctx); !errors.Is(err, client.ErrTxnFinished) {
		t.Errorf("second commit = %v, want ErrTxnFinished", err)
	}
	if err := tx.Put(ctx, []byte("k"), nil); !errors.Is(err, client.ErrTxnFinished) {
		t.Errorf("put after commit = %v, want ErrTxnFinished", err)
	}
	if err := tx.Abort(ctx); !errors.Is(err, client.ErrTxnFinished) {
		t.Errorf("abort after commit = %v, want ErrTxnFinished", err)
	}
	check := db.Begin()
	if v, ok, err := check.Get(ctx, []byte("good")); !ok || string(v) != "1" || err != nil {
		t.Fatalf("good write = %q %v %v", v, ok, err)
	}
	_ = check.Abort(ctx)
	if _, err := client.Open("../examples/one-region.yaml", client.Options{Region: "mars"}); !errors.Is(err, client.ErrUnknownRegion) {
		t.Errorf("Open in an unknown region = %v, want ErrUnknownRegion", err)
	}
}
