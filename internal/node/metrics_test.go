package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/node"
	"github.com/terroir-db/terroir/internal/topology"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// sample returns the sum of the series of text whose lines start with
// prefix (a name with its labels), or -1 when there is none.
func sample(text, prefix string) float64 {
	sum, found := 0.0, false
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
			if v, err := strconv.ParseFloat(rest, 64); err == nil {
				sum, found = sum+v, true
			}
		}
	}
	if !found {
		return -1
	}
	return sum
}

// TestMetricsHealthAndReadiness: every node serves /metrics, /healthz and
// /readyz; after transactions the series of each area named by issue 13
// carry values.
func TestMetricsHealthAndReadiness(t *testing.T) {
	c := startServing(t, "../../examples/one-region.yaml", localcluster.Options{})
	db, err := c.Client(c.Topology.Regions[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
			if err := tx.Put(ctx, []byte("a"+strconv.Itoa(i)), []byte("v")); err != nil {
				return err
			}
			return tx.Put(ctx, []byte("z"+strconv.Itoa(i)), []byte("v")) // a second range: two-phase
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Put(ctx, []byte("b"+strconv.Itoa(i)), []byte("v")); err != nil { // one range, one round trip: one-phase
			t.Fatal(err)
		}
		if _, _, err := db.Get(ctx, []byte("b0")); err != nil { // the newest version: from the cache after the first
			t.Fatal(err)
		}
		if _, err := db.View(ctx, client.Strong, func(ctx context.Context, s *client.Snapshot) error {
			_, _, err := s.Get(ctx, []byte("a1"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	var all string
	for _, id := range c.NodeIDs() {
		base := "http://" + c.Node(id).HTTPAddr()
		if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
			t.Errorf("node %d /healthz: %d %q", id, code, body)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			code, body := get(t, base+"/readyz")
			if code == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d not ready after 10 s: %d %s", id, code, body)
			}
		}
		code, body := get(t, base+"/metrics")
		if code != 200 {
			t.Fatalf("node %d /metrics: %d", id, code)
		}
		all += body
	}
	for _, want := range []string{
		`terroir_transactions_total{kind="two_phase",outcome="committed"}`,
		`terroir_transaction_commit_seconds_count{kind="two_phase"}`,
		`terroir_rpc_server_seconds_count{code="OK",method="Range/Prepare"}`,
		`terroir_snapshot_read_epoch_wait_seconds_count{mode="regional"}`,
		`terroir_lock_wait_seconds_count`,
		`terroir_commit_stage_seconds_count{stage="locks"}`, `terroir_commit_stage_seconds_count{stage="epochs"}`,
		`terroir_commit_stage_seconds_count{stage="replicate"}`, `terroir_commit_epochs_read_ahead_total`,
		`terroir_epoch_advance_interval_seconds_count{kind="local-epoch"}`,
		`terroir_raft_proposals_total`, `terroir_raft_entries_applied_total`, `terroir_raft_apply_seconds_count`,
		`terroir_raft_append_sync_seconds_count`, `terroir_raft_leadership_changes_total`, `terroir_raft_leaders`,
		`terroir_raft_messages_sent_total{type="MsgApp"}`, `terroir_raft_messages_sent_total{type="MsgAppResp"}`,
		`terroir_pebble_wal_written_bytes_total`, `terroir_pebble_disk_usage_bytes`,
		`terroir_storage_row_cache_hits_total`, `terroir_storage_row_cache_misses_total`, `terroir_storage_row_cache_bytes`,
		`terroir_epoch_read_rounds_total{kind="local-epoch",region="us-east1"}`, `terroir_epoch_reads_total{kind="local-epoch",region="us-east1"}`,
		`terroir_epoch_read_round_seconds_total{kind="local-epoch",region="us-east1"}`,
		`go_goroutines`, `process_cpu_seconds_total`, `go_sched_latencies_seconds_count`, `go_cpu_classes_gc_total_cpu_seconds_total`,
		`go_sched_gomaxprocs_threads`,
	} {
		if v := sample(all, want); v <= 0 {
			t.Errorf("%s = %v across the nodes, want > 0", want, v)
		}
	}
	for _, want := range []string{`terroir_epoch_read_wait_seconds_total{kind="local-epoch",region="us-east1"} `, // zero while reads come one at a time
		"terroir_pebble_flushed_bytes_total ", "terroir_pebble_compacted_bytes_total ", "terroir_pebble_write_stall_seconds_total "} {
		if !strings.Contains(all, want) { // zero until the first flush or stall
			t.Errorf("no %sseries", want)
		}
	}
	// Messages a replica hands to itself (raft.IsLocalMsg) never cross
	// the network: no series counts them.
	if strings.Contains(all, `terroir_raft_messages_sent_total{type="MsgHup"}`) || strings.Contains(all, `terroir_raft_messages_sent_total{type="MsgStorageAppend"}`) {
		t.Error("terroir_raft_messages_sent_total has a series for a local message type")
	}
	if !regexp.MustCompile(`terroir_epoch\{group="\d+",kind="local-epoch",region="us-east1"\} [1-9]`).MatchString(all) {
		t.Error("no terroir_epoch series for the local epoch group")
	}
}

// TestHTTPAddressInUseStopsTheNode: a node told to serve metrics on an
// address it cannot bind refuses to start, naming it.
func TestHTTPAddressInUseStopsTheNode(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	top, err := topology.Load("../../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	top = top.WithAddrs(map[uint64]string{1: l.Addr().String()})
	n, err := node.Start(node.Config{Topology: top, NodeID: 1, DataDir: t.TempDir(), Insecure: true, Listener: l, HTTPAddr: busy.Addr().String()})
	if err == nil {
		n.Close()
		t.Fatal("the node started although its HTTP address is taken")
	}
	if !strings.Contains(err.Error(), "serve metrics and the console on "+busy.Addr().String()) || !errors.Is(err, err) {
		t.Fatalf("error = %v, want it to name the address", err)
	}
}

// TestGrafanaDashboardUsesServedSeries: every series the dashboard in
// deploy/grafana queries is one a node serves.
func TestGrafanaDashboardUsesServedSeries(t *testing.T) {
	c := startServing(t, "../../examples/one-region.yaml", localcluster.Options{})
	_, served := get(t, "http://"+c.Node(1).HTTPAddr()+"/metrics")
	data, err := os.ReadFile("../../deploy/grafana/terroir.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`\b((?:terroir|go|process)_[a-z0-9_]+)`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range names.FindAllString(tg.Expr, -1) {
				n++
				if !strings.Contains(served, "\n"+m+" ") && !strings.Contains(served, "\n"+m+"{") {
					t.Errorf("panel %q queries %s, which no node serves", p.Title, m)
				}
			}
		}
	}
	if n < 30 {
		t.Fatalf("the dashboard queries only %d series", n)
	}
}

// TestPprofOnlyWhenAsked: a node started with Pprof serves Go's profile
// index and symbol lookup (GET and POST) on its HTTP address; one started
// without it does not.
func TestPprofOnlyWhenAsked(t *testing.T) {
	top, err := topology.Load("../../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{true, false} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n, err := node.Start(node.Config{Topology: top.WithAddrs(map[uint64]string{1: l.Addr().String()}), NodeID: 1,
			DataDir: t.TempDir(), Insecure: true, Listener: l, HTTPAddr: "127.0.0.1:0", Pprof: on})
		if err != nil {
			t.Fatalf("Pprof %v: %v", on, err)
		}
		base := "http://" + n.HTTPAddr() + "/debug/pprof/"
		code, body := get(t, base)
		posted, err := http.Post(base+"symbol", "text/plain", strings.NewReader("0x1"))
		if err != nil {
			n.Close()
			t.Fatal(err)
		}
		posted.Body.Close()
		n.Close()
		served := code == http.StatusOK && strings.Contains(body, "goroutine") && posted.StatusCode == http.StatusOK
		if served != on {
			t.Errorf("Pprof %v: index %d (%d bytes), symbol POST %d", on, code, len(body), posted.StatusCode)
		}
	}
}
