package localcluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

func oneRegion(t *testing.T) *topology.Topology {
	t.Helper()
	top, err := topology.Load("../../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return top
}

func TestEpochAdvancesAndCloseLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t)
	c, err := Start(oneRegion(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.EpochReader("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	second, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 300 ms at a 10 ms interval: at least a handful of advances, even on a slow machine.
	if second < first+5 {
		t.Fatalf("epoch went from %d to %d in 300ms; want at least 5 advances", first, second)
	}
	t.Logf("epoch %d -> %d", first, second)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// Under the race detector every dialer of the cluster, its nodes' and its
// clients', pings with raceProbeScale times the default bound; otherwise
// with the default (what a deployment runs).
func TestRaceDetectorWidensThePingBound(t *testing.T) {
	c, err := Start(oneRegion(t), Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := transport.DefaultProbeTimeout
	if raceEnabled {
		want *= raceProbeScale
	}
	node, err := c.NodeDialer(1)
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]*transport.Dialer{"client": c.Dialer("us-east1"), "node 1": node} {
		if got := d.Detector().ProbeTimeout; got != want {
			t.Fatalf("%s's dialer pings with a %v bound (race detector: %v), want %v", name, got, raceEnabled, want)
		}
	}
}

// A cluster's groups elect, as their first leaders, the replicas their
// nodes chose (raftgroup.Group.StartLeader, which LeadAtStart campaigns
// for at once) rather than whichever replica's election timeout ran out
// first: with three voters each, five groups would match by chance one
// time in 243.
func TestGroupsElectTheirStartLeadersFirst(t *testing.T) {
	started := time.Now()
	c, err := Start(oneRegion(t), Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	up := time.Since(started)
	first := map[uint64]uint64{}
	deadline := time.Now().Add(10 * time.Second)
	for len(first) < len(c.Topology.Groups) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s only groups %v have leaders", first)
		}
		for _, g := range c.Topology.Groups {
			if _, seen := first[g.ID]; !seen {
				if l := c.Leader(g.ID); l != 0 {
					first[g.ID] = l
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("nodes started in %v; every group led %v after", up.Round(time.Millisecond), (time.Since(started) - up).Round(time.Millisecond))
	for _, g := range c.Topology.Groups {
		want := c.Node(g.Replicas[0]).Group(g.ID).StartLeader()
		if want == 0 || !slices.Contains(g.Replicas, want) {
			t.Fatalf("group %d: start leader %d is not one of its replicas %v", g.ID, want, g.Replicas)
		}
		if first[g.ID] != want {
			t.Errorf("group %d (%s): first leader %d, want its start leader %d", g.ID, g.Kind, first[g.ID], want)
		}
	}
}
