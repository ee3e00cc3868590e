package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/backup"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

func run(args ...string) error {
	cmd := rootCmd()
	cmd.SetArgs(args)
	return cmd.Execute()
}

// TestDemoRunsAndStops runs the demo briefly; its report must count
// snapshots of both strong modes, which take turns.
func TestDemoRunsAndStops(t *testing.T) {
	out := t.TempDir()
	if err := run("demo", "--duration", "2s", "--records", "100", "--out", out); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	var strong, local, failed int
	for _, line := range strings.Split(string(report), "\n") {
		if _, err := fmt.Sscanf(line, "- snapshots: %d strong and %d strong-local completed, %d failed", &strong, &local, &failed); err == nil {
			break
		}
	}
	if strong == 0 || local == 0 || failed != 0 {
		t.Fatalf("the demo's report counts %d strong and %d strong-local snapshots, %d failed; want both modes run, none failed:\n%s", strong, local, failed, report)
	}
}

func TestStartRejectsBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("regions: [a]\nnodes:\n  - {id: 1, region: b, addr: \"127.0.0.1:1\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run("start", "--config", bad, "--node", "1", "--data-dir", t.TempDir())
	if !errors.Is(err, topology.ErrInvalid) || !strings.Contains(err.Error(), `unknown region "b"`) {
		t.Fatalf("start with a bad topology = %v, want an invalid-topology error naming region b", err)
	}
	err = run("start", "--config", "../../examples/one-region.yaml", "--node", "9", "--data-dir", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "--node 9 is not in") {
		t.Fatalf("start with an unknown node = %v", err)
	}
}

func TestKVAgainstACluster(t *testing.T) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	certs := c.CertsDir()
	data, err := c.Topology.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(cfg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	kv := func(args ...string) (string, error) {
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"kv", "--config", cfg, "--certs-dir", certs}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	if _, err := kv("put", "greeting", "hello"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv("put", "zebra", "stripes"); err != nil {
		t.Fatal(err)
	}
	out, err := kv("get", "greeting")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); err != nil || lines[len(lines)-1] != "hello" {
		t.Fatalf("get printed %q (%v), want hello on the last line", out, err)
	}
	if out, err := kv("scan", "a"); err != nil || out != "greeting\thello\nzebra\tstripes\n" {
		t.Fatalf("scan printed %q (%v)", out, err)
	}
	if _, err := kv("del", "greeting"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv("get", "greeting"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("get of a deleted key = %v, want not found", err)
	}
	if _, err := kv("put", "", "v"); !errors.Is(err, client.ErrEmptyKey) {
		t.Fatalf("put with an empty key = %v, want ErrEmptyKey", err)
	}
	if _, err := kv("put", "k", strings.Repeat("v", client.MaxValueSize+1)); !errors.Is(err, client.ErrValueTooLarge) {
		t.Fatalf("put of an oversized value = %v, want ErrValueTooLarge", err)
	}

	// admin range split: the range holding "t" ([m, )) splits there; the
	// data reads back across the new boundary; bad keys change nothing.
	rangeCmd := func(verb string, args ...string) (string, error) {
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"admin", "--config", cfg, "--certs-dir", certs, "range", verb}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	admin := func(args ...string) (string, error) { return rangeCmd("split", args...) }
	out, err = admin("t")
	if err != nil || !strings.Contains(out, `split range 11 at "t"`) || !strings.Contains(out, `["m", "t")`) || !strings.Contains(out, `["t", "")`) {
		t.Fatalf("admin range split t printed %q (%v)", out, err)
	}
	if out, err := kv("scan", "a"); err != nil || out != "zebra\tstripes\n" {
		t.Fatalf("scan after the split printed %q (%v)", out, err)
	}
	for _, bad := range []string{"t", "m", ""} {
		if _, err := admin(bad); !errors.Is(err, client.ErrSplitKey) {
			t.Errorf("admin range split %q = %v, want ErrSplitKey", bad, err)
		}
	}
	cmd := rootCmd()
	var list bytes.Buffer
	cmd.SetOut(&list)
	cmd.SetArgs([]string{"admin", "--config", cfg, "--certs-dir", certs, "range", "list"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(list.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "id") {
		t.Fatalf("range list printed:\n%s\nwant a header and three ranges", list.String())
	}
	for i, want := range []string{`["", "m")`, `["m", "t")`, `["t", "")`} {
		if !strings.Contains(lines[i+1], want) || !strings.Contains(lines[i+1], "us-east1") {
			t.Errorf("range list line %d = %q, want span %s in us-east1", i+1, lines[i+1], want)
		}
	}
	t.Logf("range list:\n%s", list.String())

	// admin range merge: [m, t) absorbs [t, ); the last range has no
	// neighbour to absorb, and nothing changes.
	out, err = rangeCmd("merge", "p")
	if err != nil || !strings.Contains(out, `merged into range 11`) || !strings.Contains(out, `["m", "")`) {
		t.Fatalf("admin range merge p printed %q (%v)", out, err)
	}
	if _, err := rangeCmd("merge", "x"); !errors.Is(err, client.ErrMergeLast) {
		t.Errorf("admin range merge of the last range = %v, want ErrMergeLast", err)
	}
	if out, err := kv("scan", "a"); err != nil || out != "zebra\tstripes\n" {
		t.Fatalf("scan after the merge printed %q (%v)", out, err)
	}

	// admin range transfer-lease: the lease of [m, ) goes to another of its
	// replicas; a node that is not one, or a bad node id, changes nothing.
	for _, to := range []string{"1", "2"} {
		out, err = rangeCmd("transfer-lease", "p", to)
		if err != nil && errors.Is(err, client.ErrLeaseTarget) {
			continue // node 1 may hold it already
		}
		if err != nil || !strings.Contains(out, "node "+to+" holds range 11's lease from local epoch") {
			t.Fatalf("admin range transfer-lease p %s printed %q (%v)", to, out, err)
		}
	}
	if _, err := rangeCmd("transfer-lease", "p", "9"); !errors.Is(err, client.ErrLeaseTarget) {
		t.Errorf("admin range transfer-lease to node 9 = %v, want ErrLeaseTarget", err)
	}
	if _, err := rangeCmd("transfer-lease", "p", "two"); err == nil || !strings.Contains(err.Error(), "not a node id") {
		t.Errorf("admin range transfer-lease to node two = %v, want a bad node id", err)
	}

	// admin range move: every node of this one-region cluster hosts [m, ),
	// so any move is refused and changes nothing (client's
	// TestMoveReplicasUnderLoad moves replicas onto a fourth node).
	if _, err := rangeCmd("move", "p", "1", "2"); !errors.Is(err, client.ErrMoveTarget) {
		t.Errorf("admin range move p 1 2 = %v, want ErrMoveTarget", err)
	}
	if _, err := rangeCmd("move", "p", "1", "x"); err == nil || !strings.Contains(err.Error(), "not a node id") {
		t.Errorf("admin range move p 1 x = %v, want a bad node id", err)
	}

	// admin node: the registry lists the file's three nodes, live; the
	// decommission of a node that hosts the region's epoch, txn-state and
	// directory groups, of an unknown node or a bad id is refused.
	nodeCmd := func(args ...string) (string, error) {
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"admin", "--config", cfg, "--certs-dir", certs, "node"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	var nodes string
	for deadline := time.Now().Add(10 * time.Second); ; { // every node heard from by the directory's leader
		if nodes, err = nodeCmd("list"); err != nil || strings.Count(nodes, "not live") == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if lines := strings.Split(strings.TrimSpace(nodes), "\n"); err != nil || len(lines) != 4 || !strings.HasPrefix(lines[0], "id") {
		t.Fatalf("admin node list printed:\n%s(%v)\nwant a header and three nodes", nodes, err)
	} else {
		for i, l := range lines[1:] {
			if f := strings.Fields(l); len(f) < 7 || f[0] != strconv.Itoa(i+1) || f[1] != "us-east1" || f[3] != "live" || f[4] != "live" {
				t.Errorf("admin node list line %q: want node %d of us-east1, live and live", l, i+1)
			}
		}
	}
	t.Logf("node list:\n%s", nodes)
	if _, err := nodeCmd("decommission", "1"); !errors.Is(err, directory.ErrTooFewNodes) {
		t.Errorf("admin node decommission 1 of 3 = %v, want ErrTooFewNodes", err)
	}
	for _, bad := range []string{"9", "x"} {
		if _, err := nodeCmd("decommission", bad); !errors.Is(err, directory.ErrUnknownNode) {
			t.Errorf("admin node decommission %s = %v, want ErrUnknownNode", bad, err)
		}
	}

	// admin gc: gc_ttl set at run time shows in every region; a bad one is
	// refused and changes nothing.
	gcCmd := func(args ...string) (string, error) {
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"admin", "--config", cfg, "--certs-dir", certs, "gc"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	if out, err := gcCmd("ttl", "2h"); err != nil || !strings.Contains(out, "gc_ttl is 2h0m0s") {
		t.Fatalf("admin gc ttl 2h printed %q (%v)", out, err)
	}
	for _, bad := range []string{"10ms", "forever", "0"} {
		if _, err := gcCmd("ttl", bad); !errors.Is(err, directory.ErrBadGCTTL) {
			t.Errorf("admin gc ttl %s = %v, want ErrBadGCTTL", bad, err)
		}
	}
	if out, err := gcCmd("show"); err != nil || !strings.Contains(out, "us-east1") || !strings.Contains(out, "2h0m0s") {
		t.Fatalf("admin gc show printed %q (%v), want us-east1 at 2h0m0s", out, err)
	}
	if out, err := gcCmd("ttl", "default"); err != nil || !strings.Contains(out, "topology file's (4h0m0s)") {
		t.Fatalf("admin gc ttl default printed %q (%v)", out, err)
	}

	// backup and restore: a backup of the cluster holds its one key; a
	// restore into it (it holds data) is refused.
	bk := filepath.Join(t.TempDir(), "bk")
	cmd = rootCmd()
	var bout bytes.Buffer
	cmd.SetOut(&bout)
	cmd.SetErr(&bout)
	cmd.SetArgs([]string{"backup", "--cluster", cfg, "--certs-dir", certs, "--to", bk})
	if err := cmd.Execute(); err != nil || !strings.Contains(bout.String(), "backup at epoch") || !strings.Contains(bout.String(), "1 keys") {
		t.Fatalf("backup printed %q (%v)", bout.String(), err)
	}
	cmd = rootCmd()
	bout.Reset()
	cmd.SetOut(&bout)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"backup", "--cluster", cfg, "--certs-dir", certs, "--to", bk + "-inc", "--incremental-from", bk})
	if err := cmd.Execute(); err != nil || !strings.Contains(bout.String(), "incremental backup since epoch") || !strings.Contains(bout.String(), "0 keys") {
		t.Fatalf("incremental backup printed %q (%v)", bout.String(), err)
	}
	cmd = rootCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"restore", "--cluster", cfg, "--certs-dir", certs, "--from", bk + "-inc"})
	if err := cmd.Execute(); !errors.Is(err, backup.ErrNotEmpty) {
		t.Fatalf("restore into a cluster with data = %v, want ErrNotEmpty", err)
	}

	// changefeed: from the start of history, the one key's write and a
	// resolved epoch, as JSON lines.
	cmd = rootCmd()
	var feed bytes.Buffer
	cmd.SetOut(&feed)
	cmd.SetArgs([]string{"changefeed", "--cluster", cfg, "--certs-dir", certs, "--prefix", "z", "--all", "--for", "2s"})
	if err := cmd.Execute(); err != nil || !strings.Contains(feed.String(), `{"key":"zebra","value":"stripes","version":{"epoch":`) ||
		!strings.Contains(feed.String(), `"region":"us-east1"}`) || !strings.Contains(feed.String(), `{"resolved":`) {
		t.Fatalf("changefeed printed %q (%v)", feed.String(), err)
	}
	cmd = rootCmd()
	cmd.SetArgs([]string{"changefeed", "--cluster", cfg, "--certs-dir", certs, "--all", "--from-epoch", "5"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "choose one") {
		t.Fatalf("changefeed --all --from-epoch = %v, want a refusal", err)
	}
}
