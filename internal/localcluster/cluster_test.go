package localcluster

import (
	"context"
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
