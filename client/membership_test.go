package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/node"
	"github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// threeNodes is examples/one-region.yaml with a short liveness timeout, so
// a stopped node is seen down within a second.
const threeNodes = `local_epoch_interval: 10ms
raft_tick: 10ms
liveness_timeout: 1s
regions: [us-east1]
nodes:
  - {id: 1, region: us-east1, addr: "127.0.0.1:7101"}
  - {id: 2, region: us-east1, addr: "127.0.0.1:7102"}
  - {id: 3, region: us-east1, addr: "127.0.0.1:7103"}
groups:
  - {id: 1, kind: local-epoch, region: us-east1, replicas: [1, 2, 3]}
  - {id: 2, kind: txn-state, region: us-east1, replicas: [1, 2, 3]}
  - {id: 3, kind: directory, region: us-east1, replicas: [1, 2, 3]}
  - {id: 10, kind: range, region: us-east1, start: "", end: "m", replicas: [1, 2, 3]}
  - {id: 11, kind: range, region: us-east1, start: "m", replicas: [1, 2, 3]}
`

// threeNodesFile writes threeNodes, with extra lines, to a file and
// returns its path.
func threeNodesFile(t *testing.T, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "three.yaml")
	if err := os.WriteFile(path, []byte(threeNodes+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// nodeRows reads the registry as `admin node list` does, by id.
func nodeRows(t *testing.T, ctx context.Context, c *localcluster.Cluster) map[uint64]admin.NodeRow {
	t.Helper()
	d := c.Dialer("us-east1")
	rows, err := admin.Nodes(ctx, d, c.Topology)
	if err != nil {
		t.Fatalf("listing nodes: %v", err)
	}
	out := map[uint64]admin.NodeRow{}
	for _, r := range rows {
		out[r.ID] = r
	}
	return out
}

// awaitRows polls the registry until ok holds of it.
func awaitRows(t *testing.T, ctx context.Context, c *localcluster.Cluster, what string, ok func(map[uint64]admin.NodeRow) bool) map[uint64]admin.NodeRow {
	t.Helper()
	for {
		rows := nodeRows(t, ctx, c)
		if ok(rows) {
			return rows
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: never happened; nodes: %+v", what, rows)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestJoinRebalanceDecommission grows a one-region cluster from three nodes
// to five under bank load (DESIGN.md §12): the joiners register and the
// region's replicate queue fills them without an operator moving anything;
// a joined node is decommissioned and drained until gone; joins and
// decommissions that would break the cluster are refused, and a replica
// cannot move to a gone or a stopped node. The load never stops and every
// total read is right.
func TestJoinRebalanceDecommission(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, ""), localcluster.Options{RebalanceInterval: 200 * time.Millisecond})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 150*time.Second)
	fund(t, ctx, db)
	load := startBankLoad(t, ctx, c)

	d := c.Dialer("us-east1")
	// Grow to five: the queue moves replicas to the joiners.
	for _, id := range []uint64{4, 5} {
		if err := c.JoinNode(id, "us-east1"); err != nil {
			t.Fatalf("joining node %d: %v", id, err)
		}
	}
	began := time.Now()
	rows := awaitRows(t, ctx, c, "replicas on both joiners", func(rows map[uint64]admin.NodeRow) bool {
		return len(rows) == 5 && rows[4].Replicas > 0 && rows[5].Replicas > 0 && rows[4].Live && rows[5].Live
	})
	t.Logf("balanced %v after the joins: %+v", time.Since(began).Round(time.Millisecond), rows)

	// Bad joins change nothing.
	if err := c.JoinNode(6, "eu-west1"); !errors.Is(err, directory.ErrUnknownRegion) {
		t.Errorf("join in an unknown region = %v; want ErrUnknownRegion", err)
	}
	n1, _ := c.Net.Node(1)
	if _, err := node.Join(ctx, node.JoinConfig{Peers: []string{n1.Addr}, NodeID: 7, Region: "us-east1", Addr: n1.Addr,
		DataDir: filepath.Join(t.TempDir(), "n7"), Certs: nodeCerts(t, c, 7)}); !errors.Is(err, directory.ErrDuplicateAddr) {
		t.Errorf("join at node 1's address = %v; want ErrDuplicateAddr", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := node.Join(ctx, node.JoinConfig{Peers: []string{n1.Addr}, NodeID: 2, Region: "us-east1", Addr: l.Addr().String(),
		DataDir: filepath.Join(t.TempDir(), "n2"), Certs: nodeCerts(t, c, 2)}); !errors.Is(err, directory.ErrNodeExists) {
		t.Errorf("a fresh node joining as node 2 = %v; want ErrNodeExists", err)
	}
	if got := nodeRows(t, ctx, c); len(got) != 5 {
		t.Errorf("after refused joins the registry has %d nodes: %+v", len(got), got)
	}

	// The queue settles: replica counts, of ranges and groups together
	// (15 replicas), within one across the five nodes.
	rows = awaitRows(t, ctx, c, "replica counts within one", func(rows map[uint64]admin.NodeRow) bool {
		lo, hi := 1<<30, -1
		for _, id := range []uint64{1, 2, 3, 4, 5} {
			lo, hi = min(lo, rows[id].Replicas), max(hi, rows[id].Replicas)
		}
		return lo >= 0 && hi-lo <= 1
	})
	t.Logf("settled: %+v", rows)

	// A joiner stops: once its region counts it down, no replica of a
	// range or a group it lacks (it hosts three of the five) moves to it.
	const dead = 5
	if err := c.StopNode(dead); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "the stopped joiner not live", func(rows map[uint64]admin.NodeRow) bool { return !rows[dead].Live })
	refused := 0
	for id, key := range map[uint64][]byte{10: account(0), 11: []byte("x-acct-00")} {
		if d := newestDesc(c, id); d != nil && !slices.Contains(d.GetReplicas(), dead) {
			_, err := db.AdminMoveReplica(ctx, key, d.GetReplicas()[0], dead)
			if !errors.Is(err, client.ErrMoveTarget) || !strings.Contains(err.Error(), "not live") {
				t.Errorf("moving a replica of range %d to stopped node %d = %v; want ErrMoveTarget (not live)", id, dead, err)
			}
			refused++
		}
	}
	for _, g := range []uint64{1, 2, 3} {
		v, err := transport.LocateGroup(ctx, d, g, []uint64{1, 2, 3, 4})
		if err != nil || slices.Contains(v.Voters, dead) {
			continue
		}
		_, err = admin.MoveGroupReplica(ctx, d, c.Topology, g, v.Voters[0], dead)
		if !errors.Is(err, admin.ErrBadGroupMove) || !strings.Contains(err.Error(), "not live") {
			t.Errorf("moving group %d's replica to stopped node %d = %v; want ErrBadGroupMove (not live)", g, dead, err)
		}
		refused++
	}
	if refused == 0 {
		t.Fatalf("stopped node %d hosts every range and group: nothing to refuse", dead)
	}
	if err := c.RestartNode(dead); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "the joiner live again", func(rows map[uint64]admin.NodeRow) bool { return rows[dead].Live })

	// Decommission node 4: the queue drains it and marks it gone.
	if err := admin.SetNodeState(ctx, d, c.Topology, "us-east1", 4, directorypb.NodeState_NODE_DECOMMISSIONING); err != nil {
		t.Fatalf("decommissioning node 4: %v", err)
	}
	began = time.Now()
	awaitRows(t, ctx, c, "node 4 gone", func(rows map[uint64]admin.NodeRow) bool { return rows[4].State == "gone" })
	t.Logf("node 4 drained and gone in %v", time.Since(began).Round(time.Millisecond))
	for _, id := range []uint64{10, 11} {
		if r := c.Node(4).Range(id); r != nil {
			t.Errorf("gone node 4 still hosts range %d", id)
		}
	}
	if _, err := db.AdminMoveReplica(ctx, account(0), 1, 4); !errors.Is(err, client.ErrMoveTarget) {
		t.Errorf("moving a replica to gone node 4 = %v; want ErrMoveTarget", err)
	}
	if err := admin.SetNodeState(ctx, d, c.Topology, "us-east1", 4, directorypb.NodeState_NODE_LIVE); !errors.Is(err, directory.ErrNodeState) {
		t.Errorf("recommissioning gone node 4 = %v; want ErrNodeState", err)
	}

	// With node 5 down, the region's registry refuses a decommission that
	// would leave two live nodes.
	if err := c.StopNode(5); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "node 5 not live", func(rows map[uint64]admin.NodeRow) bool { return !rows[5].Live })
	if err := directory.NewDirectories(c.Topology, d).Of("us-east1").SetNodeState(ctx, 3, directorypb.NodeState_NODE_DECOMMISSIONING); !errors.Is(err, directory.ErrTooFewNodes) {
		t.Errorf("decommissioning node 3 with node 5 down = %v; want ErrTooFewNodes", err)
	}
	if rows := nodeRows(t, ctx, c); rows[3].State != "live" {
		t.Errorf("after a refused decommission node 3 is %s", rows[3].State)
	}
	if err := c.RestartNode(5); err != nil {
		t.Fatal(err)
	}

	awaitLoad(t, ctx, load)
	load.stop()
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Fatalf("final total %d, %v", sum, err)
	}
	t.Logf("%d transfers, %d total checks", load.transfers.Load(), load.checks.Load())
}

// newestDesc returns the newest descriptor of range id among the running
// nodes' replicas (nil: none hosts it).
func newestDesc(c *localcluster.Cluster, id uint64) *rangepb.RangeDescriptor {
	var out *rangepb.RangeDescriptor
	for _, n := range c.NodeIDs() {
		if nd := c.Node(n); nd != nil {
			if r := nd.Range(id); r != nil && (out == nil || r.Desc().GetGeneration() > out.GetGeneration()) {
				out = r.Desc()
			}
		}
	}
	return out
}

func nodeCerts(t *testing.T, c *localcluster.Cluster, id uint64) *security.Certs {
	t.Helper()
	certs, err := c.NodeCerts(id, "us-east1")
	if err != nil {
		t.Fatal(err)
	}
	return certs
}

// A one-region cluster of three grows to five under load, then two of the
// original nodes — hosts of the region's epoch, transaction-state and
// directory groups — are decommissioned and stopped, one after the other
// (DESIGN.md §12): the replicate queue moves every replica of every group
// off them. The bank load never stops and its total never changes, and
// porcupine accepts the history of the random transactions run meanwhile.
func TestGrowThenDecommissionOriginals(t *testing.T) {
	checkStrictSerializability(t, ssRun{topology: threeNodesFile(t, "rebalance_interval: 200ms\n"), regions: []string{"us-east1"}, ks: oneRegionKeys,
		clients: 4, perClient: 150, chaos: func(c *localcluster.Cluster) {
			ctx := ctxT(t, 150*time.Second)
			db, err := c.Client("us-east1")
			if err != nil {
				t.Error(err)
				return
			}
			fund(t, ctx, db)
			load := startBankLoad(t, ctx, c)
			defer func() {
				load.stop()
				if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
					t.Errorf("final total %d, %v", sum, err)
				}
				t.Logf("%d transfers, %d total checks", load.transfers.Load(), load.checks.Load())
			}()
			for _, id := range []uint64{4, 5} {
				if err := c.JoinNode(id, "us-east1"); err != nil {
					t.Errorf("joining node %d: %v", id, err)
					return
				}
			}
			awaitRows(t, ctx, c, "replicas on both joiners", func(rows map[uint64]admin.NodeRow) bool {
				return len(rows) == 5 && rows[4].Replicas > 0 && rows[5].Replicas > 0
			})
			awaitLoad(t, ctx, load)
			d := c.Dialer("us-east1")
			for _, id := range []uint64{1, 2} {
				began := time.Now()
				if err := admin.SetNodeState(ctx, d, c.Topology, "us-east1", id, directorypb.NodeState_NODE_DECOMMISSIONING); err != nil {
					t.Errorf("decommissioning node %d: %v", id, err)
					return
				}
				awaitRows(t, ctx, c, fmt.Sprintf("node %d gone", id), func(rows map[uint64]admin.NodeRow) bool { return rows[id].State == "gone" })
				if n := c.Node(id); n != nil {
					if st := n.Status(ctx); len(st.GetGroups()) > 0 {
						t.Errorf("gone node %d still hosts %d groups: %v", id, len(st.GetGroups()), st.GetGroups())
					}
				}
				if err := c.StopNode(id); err != nil {
					t.Error(err)
					return
				}
				t.Logf("node %d drained, gone and stopped in %v", id, time.Since(began).Round(time.Millisecond))
				awaitLoad(t, ctx, load)
			}
			// Every group has three voters, none on the stopped nodes.
			for _, g := range c.Topology.Groups {
				if g.Kind == topology.KindRange {
					continue
				}
				v, err := transport.LocateGroup(ctx, d, g.ID, []uint64{3, 4, 5})
				if err != nil || len(v.Voters) != 3 || slices.Contains(v.Voters, 1) || slices.Contains(v.Voters, 2) {
					t.Errorf("group %d (%s) after the decommissions: voters %v, %v", g.ID, g.Kind, v.Voters, err)
				}
			}
		}})
}

// A node whose data directory is lost is replaced (DESIGN.md §12): node 3
// is killed and its directory deleted; a new node joins with a new id and
// address, and once node 3 has been down for replace_after the replicate
// queue rebuilds every replica it held — of the ranges and of the epoch,
// transaction-state and directory groups — on the new node. The cluster
// returns to three voters of every group, none on node 3, and the bank
// load goes on with its total intact.
func TestReplaceWipedNode(t *testing.T) {
	c := localcluster.StartT(t, threeNodesFile(t, "rebalance_interval: 200ms\nreplace_after: 2s\n"), localcluster.Options{})
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 150*time.Second)
	fund(t, ctx, db)
	load := startBankLoad(t, ctx, c)

	if err := c.KillNode(3); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(c.DataDir(), "node-3")); err != nil {
		t.Fatal(err)
	}
	if err := c.JoinNode(6, "us-east1"); err != nil {
		t.Fatalf("the replacement joining: %v", err)
	}
	began := time.Now()
	d := c.Dialer("us-east1")
	for {
		var pending []string // the groups not yet rebuilt, with their voters as seen
		for _, g := range c.Topology.Groups {
			var voters []uint64
			if g.Kind == topology.KindRange {
				if r := c.Node(1).Range(g.ID); r != nil {
					voters = r.Desc().GetReplicas()
				}
			} else if v, err := transport.LocateGroup(ctx, d, g.ID, []uint64{1, 2, 6}); err == nil && !v.Joint {
				voters = v.Voters
			}
			if len(voters) != 3 || slices.Contains(voters, 3) || !slices.Contains(voters, 6) {
				pending = append(pending, fmt.Sprintf("%s %d: voters %v (leader %d)", g.Kind, g.ID, voters, c.Leader(g.ID)))
			}
		}
		if len(pending) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node 3's replicas were not rebuilt on the replacement: %v", pending)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("every group has three voters, one on the replacement, %v after it joined", time.Since(began).Round(time.Millisecond))
	awaitLoad(t, ctx, load)
	load.stop()
	if sum, err := total(ctx, db); err != nil || sum != accounts*initialBalance {
		t.Fatalf("final total %d, %v", sum, err)
	}
	t.Logf("%d transfers, %d total checks", load.transfers.Load(), load.checks.Load())
}

// TestDecommissionRightAfterADirectoryLeaderChange: a directory leader
// elected a moment ago has heard no heartbeat yet; a decommission it is
// asked for then waits until the region's live nodes have had time to
// find it (half the default 5 s liveness timeout, longer than one attempt
// of the client's), rather than refusing with ErrTooFewNodes on an empty
// view.
func TestDecommissionRightAfterADirectoryLeaderChange(t *testing.T) {
	c := localcluster.StartT(t, "../examples/one-region.yaml", localcluster.Options{RebalanceInterval: -1})
	ctx := ctxT(t, 60*time.Second)
	if err := c.JoinNode(4, "us-east1"); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, ctx, c, "four live nodes", func(rows map[uint64]admin.NodeRow) bool {
		return len(rows) == 4 && rows[1].Live && rows[2].Live && rows[3].Live && rows[4].Live
	})
	const dir = 3 // the directory group of one-region.yaml
	deadline := time.Now().Add(10 * time.Second)
	from := c.Leader(dir)
	for ; from == 0 && time.Now().Before(deadline); from = c.Leader(dir) {
		time.Sleep(10 * time.Millisecond)
	}
	if from == 0 {
		t.Fatal("the directory group has no leader")
	}
	to := from%3 + 1
	for c.Leader(dir) != to {
		if time.Now().After(deadline) {
			t.Fatalf("directory leadership never moved from node %d to node %d", from, to)
		}
		if l := c.Leader(dir); l != 0 {
			c.Node(l).Group(dir).TransferLeadership(to)
		}
		time.Sleep(2 * time.Millisecond)
	}
	began := time.Now()
	if err := admin.SetNodeState(ctx, c.Dialer("us-east1"), c.Topology, "us-east1", 4, directorypb.NodeState_NODE_DECOMMISSIONING); err != nil {
		t.Fatalf("decommissioning node 4 of four live nodes, right after the directory's leader moved to node %d: %v", to, err)
	}
	t.Logf("decommissioned %v after the leader change", time.Since(began).Round(time.Millisecond))
	if rows := nodeRows(t, ctx, c); rows[4].State != "decommissioning" {
		t.Errorf("node 4 is %s, want decommissioning", rows[4].State)
	}
}
