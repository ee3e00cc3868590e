package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/security"
)

// cli runs the command line as a user would and returns what it printed on
// stdout and stderr, and its exit code.
func cli(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = runCLI(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// noRPCText fails unless msg is free of gRPC's envelopes and Go's type names.
func noRPCText(t *testing.T, what, msg string) {
	t.Helper()
	for _, raw := range []string{"rpc error", "code =", "desc =", "transport: Error while dialing", "fileTopology", "Options."} {
		if strings.Contains(msg, raw) {
			t.Errorf("%s: the message shows %q: %s", what, raw, msg)
		}
	}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startCluster starts an in-process cluster of the topology at path and
// writes its topology, with the bound addresses, where the CLI can read it.
func startCluster(t *testing.T, path string) (*localcluster.Cluster, string) {
	t.Helper()
	c := localcluster.StartT(t, path, localcluster.Options{})
	data, err := c.Topology.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return c, writeFile(t, "cluster.yaml", string(data))
}

// TestCLIFailsFastWhenTheClusterIsDown: one node refuses connections, the
// other accepts them and never answers; the CLI gives up within about
// admin.ReachTimeout (2 s), naming each node it tried, for plaintext and TLS.
func TestCLIFailsFastWhenTheClusterIsDown(t *testing.T) {
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the kernel completes the handshake, nobody speaks
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	top := writeFile(t, "down.yaml", `regions: [r1]
nodes:
  - {id: 1, region: r1, addr: "`+refusedAddr+`"}
  - {id: 2, region: r1, addr: "`+silent.Addr().String()+`"}
groups:
  - {id: 10, kind: local-epoch, region: r1, replicas: [1, 2]}
  - {id: 11, kind: txn-state, region: r1, replicas: [1, 2]}
  - {id: 12, kind: directory, region: r1, replicas: [1, 2]}
  - {id: 100, kind: range, region: r1, replicas: [1, 2], start: ""}
`)
	certs := t.TempDir()
	if err := security.CreateCA(certs, "", security.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := security.CreateClient(certs, "", security.AdminUser, security.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range [][]string{{"--insecure"}, {"--certs-dir", certs}} {
		began := time.Now()
		_, stderr, code := cli(append([]string{"kv", "--config", top, "get", "k"}, mode...)...)
		took := time.Since(began)
		t.Logf("%v: failed after %v: %s", mode, took.Round(time.Millisecond), stderr)
		want := "no node of " + top + " answered (tried node 1 at " + refusedAddr
		if code == 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "connection refused") ||
			!strings.Contains(stderr, "node 2 at "+silent.Addr().String()) {
			t.Errorf("%v: exit %d, stderr %q; want it to contain %q and name node 2", mode, code, stderr, want)
		}
		if took > 3*time.Second {
			t.Errorf("%v: the CLI took %v to give up, want about 2 s", mode, took)
		}
		noRPCText(t, "cluster down", stderr)
	}
}

// TestCLIMessagesSpeakTheUsersTerms: bad topology files, a missing region,
// missing certificates.
func TestCLIMessagesSpeakTheUsersTerms(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
	}{
		{"misspelt setting", "raft_tik: 10ms\nregions: [a]\n", `line 1: unknown setting "raft_tik" at the top level (did you mean raft_tick?)`},
		{"empty file", "", "the file is empty"},
		{"a number that is not", "regions: [a]\nnodes:\n  - {id: one, region: a, addr: \"127.0.0.1:1\"}\n", `line 3: "one" is not a whole number`},
	} {
		_, stderr, code := cli("kv", "--config", writeFile(t, "t.yaml", tc.file), "--insecure", "get", "k")
		if code == 0 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "EOF") {
			t.Errorf("%s: exit %d, stderr %q, want %q", tc.name, code, stderr, tc.want)
		}
		noRPCText(t, tc.name, stderr)
	}
	_, stderr, _ := cli("kv", "--config", "../../examples/three-regions.yaml", "--insecure", "get", "k")
	if !strings.Contains(stderr, "has 3 regions (us-east1, us-west1, us-central1): pass --region") {
		t.Errorf("kv without --region on three regions: %q", stderr)
	}
	noRPCText(t, "no region", stderr)
	_, stderr, _ = cli("kv", "--config", "../../examples/three-regions.yaml", "--insecure", "--region", "mars", "get", "k")
	if !strings.Contains(stderr, `--region "mars" is not a region of`) {
		t.Errorf("kv --region mars: %q", stderr)
	}
	_, stderr, _ = cli("kv", "--config", "../../examples/one-region.yaml", "--certs-dir", t.TempDir(), "get", "k")
	if !strings.Contains(stderr, "certificates not found") || !strings.Contains(stderr, "terroir cert create-ca") || !strings.Contains(stderr, "--insecure") {
		t.Errorf("kv without certificates: %q", stderr)
	}
	_, stderr, _ = cli("start", "--config", "../../examples/one-region.yaml", "--node", "1", "--data-dir", t.TempDir(), "--certs-dir", t.TempDir())
	if !strings.Contains(stderr, "terroir cert create-node 1") {
		t.Errorf("start without certificates: %q", stderr)
	}
}

// TestCLIOnASecureCluster: what a user without the admin certificate, with
// an expired one, or asking for a mode the cluster cannot run, is told.
func TestCLIOnASecureCluster(t *testing.T) {
	c, cfg := startCluster(t, "../../examples/one-region.yaml")
	certs := c.CertsDir()
	if err := security.CreateClient(certs, "", "alice", security.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := security.CreateClient(certs, "", "old", security.CreateOptions{Lifetime: -time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Any user may write and read.
	if _, stderr, code := cli("kv", "--config", cfg, "--certs-dir", certs, "--user", "alice", "put", "k", "v"); code != 0 {
		t.Fatalf("alice's put: %s", stderr)
	}
	// An operator action needs the admin user; --verbose shows the RPC's text.
	_, stderr, code := cli("admin", "--config", cfg, "--certs-dir", certs, "--user", "alice", "range", "split", "p")
	if code == 0 || !strings.Contains(stderr, "user alice may not call Range/AdminSplit: it is for the admin user") {
		t.Errorf("alice's split: exit %d, %q", code, stderr)
	}
	noRPCText(t, "alice's split", stderr)
	_, stderr, _ = cli("admin", "--config", cfg, "--certs-dir", certs, "--user", "alice", "--verbose", "range", "split", "p")
	if !strings.Contains(stderr, "rpc error: code = PermissionDenied") {
		t.Errorf("alice's split with --verbose: %q, want the full RPC error", stderr)
	}
	// An expired certificate is named.
	_, stderr, _ = cli("kv", "--config", cfg, "--certs-dir", certs, "--user", "old", "get", "k")
	if !strings.Contains(stderr, "client.old.crt (old) expired at") {
		t.Errorf("kv with an expired certificate: %q", stderr)
	}
	// A plaintext client of a TLS cluster is told what to do.
	_, stderr, _ = cli("kv", "--config", cfg, "--insecure", "get", "k")
	if !strings.Contains(stderr, "no node of") || !strings.Contains(stderr, "TLS") {
		t.Errorf("an insecure client of a secure cluster: %q", stderr)
	}
	noRPCText(t, "insecure client", stderr)
	// The mode that ran is the mode reported.
	_, stderr, code = cli("kv", "--config", cfg, "--certs-dir", certs, "--snapshot", "strong", "get", "k")
	if code != 0 || !strings.Contains(stderr, "snapshot regional (asked strong) at epoch") {
		t.Errorf("a strong snapshot without publishers: exit %d, %q", code, stderr)
	}
	// A follower-read policy that does not exist is named.
	_, stderr, code = cli("kv", "--config", cfg, "--certs-dir", certs, "--snapshot", "serializable", "--follower-reads", "nearby", "get", "k")
	if code == 0 || !strings.Contains(stderr, `unknown follower-reads policy "nearby"`) {
		t.Errorf("an unknown follower-reads policy: exit %d, %q", code, stderr)
	}
}

// TestCLINamesACutOffAndAnExcludedRegion: with every node of us-west1
// stopped, a write homed there names the region; once an operator excludes
// it, the write says so and since which global epoch.
func TestCLINamesACutOffAndAnExcludedRegion(t *testing.T) {
	c, cfg := startCluster(t, "../../examples/three-regions.yaml")
	certs := c.CertsDir()
	kv := func(args ...string) (string, int) {
		_, stderr, code := cli(append([]string{"kv", "--config", cfg, "--certs-dir", certs, "--region", "us-east1", "--timeout", "3s"}, args...)...)
		return stderr, code
	}
	if stderr, code := kv("put", "n", "before"); code != 0 {
		t.Fatalf("put before the cut: %s", stderr)
	}
	for _, id := range []uint64{4, 5, 6} {
		if err := c.StopNode(id); err != nil {
			t.Fatal(err)
		}
	}
	stderr, code := kv("put", "n", "cut")
	if code == 0 || !strings.Contains(stderr, "in region us-west1: no answer in time (is us-west1 cut off or down?)") {
		t.Errorf("put to a cut-off region: exit %d, %q", code, stderr)
	}
	noRPCText(t, "cut-off region", stderr)
	_, out, code := cli("admin", "--config", cfg, "--certs-dir", certs, "region", "exclude", "us-west1")
	if code != 0 {
		t.Fatalf("exclude: %s", out)
	}
	listed, stderr, _ := cli("admin", "--config", cfg, "--certs-dir", certs, "region", "list")
	if !strings.Contains(listed, "us-west1\tpublisher 23\texcluded since epoch ") {
		t.Errorf("region list after the exclusion: %q %q", listed, stderr)
	}
	for _, args := range [][]string{{"put", "n", "excluded"}, {"--snapshot", "strong", "get", "n"}} {
		stderr, code = kv(args...)
		if code == 0 || !strings.Contains(stderr, "region us-west1 is excluded from the global epoch since epoch ") ||
			!strings.Contains(stderr, "terroir admin region include us-west1") {
			t.Errorf("%v in an excluded region: exit %d, %q", args, code, stderr)
		}
		noRPCText(t, "excluded region", stderr)
	}
	// Only the admin user may exclude or include.
	if err := security.CreateClient(certs, "", "alice", security.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, stderr, _ = cli("admin", "--config", cfg, "--certs-dir", certs, "--user", "alice", "region", "include", "us-west1")
	if !strings.Contains(stderr, "user alice may not call Node/SetRegionExcluded: it is for the admin user") {
		t.Errorf("alice's include: %q", stderr)
	}
}
