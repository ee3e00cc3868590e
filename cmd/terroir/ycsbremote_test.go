package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// sampleRemote reads the RPCs by method and the groups led from a node's
// /metrics, sums the methods over the nodes, and leaves out a node that
// does not answer.
func TestSampleRemoteReadsNodesMetrics(t *testing.T) {
	node := func(commits, epochs, leaders int) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, `# TYPE terroir_rpc_server_seconds histogram
terroir_rpc_server_seconds_bucket{code="OK",method="Range/CommitOnePhase",le="+Inf"} %d
terroir_rpc_server_seconds_sum{code="OK",method="Range/CommitOnePhase"} 0.5
terroir_rpc_server_seconds_count{code="OK",method="Range/CommitOnePhase"} %d
terroir_rpc_server_seconds_bucket{code="OK",method="Epoch/ReadEpoch",le="+Inf"} %d
terroir_rpc_server_seconds_sum{code="OK",method="Epoch/ReadEpoch"} 0.1
terroir_rpc_server_seconds_count{code="OK",method="Epoch/ReadEpoch"} %d
# TYPE terroir_raft_leaders gauge
terroir_raft_leaders %d
`, commits, commits, epochs, epochs, leaders)
		}))
	}
	a, b := node(10, 4, 2), node(6, 3, 3)
	defer a.Close()
	defer b.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := l.Addr().String()
	_ = l.Close() // nothing answers there
	addr := func(s *httptest.Server) string { return s.Listener.Addr().String() }
	got := sampleRemote(context.Background(), []string{addr(a), gone, addr(b)})
	if got.byMethod["Range/CommitOnePhase"] != 16 || got.byMethod["Epoch/ReadEpoch"] != 7 {
		t.Errorf("RPCs by method %v, want CommitOnePhase 16 and ReadEpoch 7", got.byMethod)
	}
	if len(got.leaders) != 2 || got.leaders[addr(a)] != 2 || got.leaders[addr(b)] != 3 {
		t.Errorf("groups led %v, want 2 at %s and 3 at %s only", got.leaders, addr(a), addr(b))
	}
}
