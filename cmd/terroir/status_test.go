package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/admin"
)

// TestStatusShowsTheClusterAndAKilledNode: status --json on a three-region
// cluster reports every node up, every group led, every range leased and
// the epochs; a killed node shows down within 5 s, in JSON and the table.
func TestStatusShowsTheClusterAndAKilledNode(t *testing.T) {
	c, cfg := startCluster(t, "../../examples/three-regions.yaml")
	status := func() *admin.ClusterStatus {
		t.Helper()
		out, stderr, code := cli("status", "--cluster", cfg, "--certs-dir", c.CertsDir(), "--json")
		if code != 0 {
			t.Fatalf("status: %s", stderr)
		}
		var st admin.ClusterStatus
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
		return &st
	}
	// Wait for every group to have a leader and every range a lease.
	var st *admin.ClusterStatus
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		st = status()
		settled := st.GlobalEpoch > 0 && len(st.Ranges) == len(c.Topology.Ranges())
		for _, g := range st.Groups {
			settled = settled && g.Leader != 0 && len(g.Replicas) == 3
		}
		for _, r := range st.Ranges {
			settled = settled && r.Leader != 0 && r.EpochsLeft != nil
		}
		if settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not settle in 30 s: %+v", st)
		}
	}
	if len(st.Nodes) != 9 || len(st.Regions) != 3 {
		t.Fatalf("status: %d nodes, %d regions", len(st.Nodes), len(st.Regions))
	}
	for _, n := range st.Nodes {
		if !n.Up || n.Version == "" || n.HTTPAddr == "" {
			t.Errorf("node %+v: want up with a version and an HTTP address", n)
		}
	}
	for _, r := range st.Regions {
		if r.Name != "us-central1" && (r.LocalEpoch == 0 || r.PublisherEpoch == 0 || r.PublisherAgeMS == 0) {
			t.Errorf("region %+v: want a local epoch, and a publisher's epoch and freshness, in each data region", r)
		}
	}
	for _, r := range st.Ranges {
		if r.LeaseHolder != r.Leader || *r.EpochsLeft <= 0 {
			t.Errorf("range %+v: want leased to its leader with epochs left", r)
		}
	}

	if err := c.KillNode(4); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		st = status()
		if !st.Nodes[3].Up {
			break
		}
		if time.Since(killed) > 5*time.Second {
			t.Fatalf("node 4 still reported up 5 s after it was killed: %+v", st.Nodes[3])
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("node 4 reported down %v after the kill: %s", time.Since(killed).Round(time.Millisecond), st.Nodes[3].Error)
	table, _, _ := cli("status", "--cluster", cfg, "--certs-dir", c.CertsDir())
	if !strings.Contains(table, "us-west1") || !strings.Contains(table, "DOWN") || !strings.Contains(table, "global epoch") {
		t.Errorf("status table:\n%s", table)
	}
	t.Logf("status:\n%s", table)
}
