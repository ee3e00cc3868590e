package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// snapshotBytesSent scrapes a node's count of bytes streamed in Raft snapshots.
func snapshotBytesSent(t *testing.T, httpAddr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "terroir_raft_snapshot_sent_bytes_total "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatal("no terroir_raft_snapshot_sent_bytes_total series")
	return 0
}

// A replica that was down while its range's log was compacted past it
// catches up by a snapshot streamed from the leader's engine (DESIGN.md
// §12), and ends with exactly the leader's data.
func TestLaggingReplicaCatchesUpByStreamedSnapshot(t *testing.T) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{CompactAfter: 50})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	value := []byte(strings.Repeat("v", 1024))
	write := func(from, to int) {
		for i := from; i < to; i++ {
			key := fmt.Sprintf("%c%04d", "cx"[i%2], i) // both ranges
			if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte(key), value) }); err != nil {
				t.Fatalf("write %s: %v", key, err)
			}
		}
	}
	write(0, 50)
	if err := c.StopNode(3); err != nil {
		t.Fatal(err)
	}
	write(50, 600) // hundreds of entries per range: the logs are compacted past node 3
	if err := c.RestartNode(3); err != nil {
		t.Fatal(err)
	}
	want, err := c.Node(1).DataStats()
	if err != nil {
		t.Fatal(err)
	}
	for {
		got, err := c.Node(3).DataStats()
		if err == nil && got == want {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node 3 holds %+v (%v), node 1 %+v", got, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sent := snapshotBytesSent(t, c.Node(1).HTTPAddr()) + snapshotBytesSent(t, c.Node(2).HTTPAddr())
	if sent < 100<<10 {
		t.Fatalf("nodes 1 and 2 streamed %v bytes of snapshots; node 3 should have caught up from one", sent)
	}
	t.Logf("node 3 caught up: %+v, %v bytes streamed", want, sent)
}
