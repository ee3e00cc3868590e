package node_test

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// roundPhases sums terroir_global_epoch_round_seconds over c's nodes: by
// phase, the phases observed and their total duration.
func roundPhases(t *testing.T, c *localcluster.Cluster) (count [epoch.NumPhases]uint64, total [epoch.NumPhases]time.Duration) {
	t.Helper()
	c.EachMetricFamily(func(mf *dto.MetricFamily) {
		if mf.GetName() != "terroir_global_epoch_round_seconds" {
			return
		}
		for _, m := range mf.GetMetric() {
			for _, p := range epoch.Phases() {
				if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == p.String() {
					count[p] += m.GetHistogram().GetSampleCount()
					total[p] += time.Duration(m.GetHistogram().GetSampleSum() * float64(time.Second))
				}
			}
		}
	})
	return count, total
}

// TestGlobalEpochRoundPhasesExplainTheInterval: on the three-region
// topology (the service in us-central1; publishers 31 and 37 ms away) the
// nodes' terroir_global_epoch_round_seconds shows each round's publish
// taking at least the farthest publisher's RTT, the advance less than
// that, and the publishers' own commit and certify within the publish
// less its nearest RTT: what an operator reads to see where the global
// epoch's interval goes.
func TestGlobalEpochRoundPhasesExplainTheInterval(t *testing.T) {
	c := startServing(t, "../../examples/three-regions.yaml", localcluster.Options{})
	const rounds = 10
	var count [epoch.NumPhases]uint64
	var total [epoch.NumPhases]time.Duration
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if count, total = roundPhases(t, c); count[epoch.PhasePublish] >= rounds && count[epoch.PhaseAdvance] >= rounds {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s, rounds observed by phase: %v; want at least %d publishes and advances", count, rounds)
		}
	}
	mean := func(p epoch.Phase) time.Duration { return total[p] / time.Duration(max(count[p], 1)) }
	publish, advance := mean(epoch.PhasePublish), mean(epoch.PhaseAdvance)
	at := mean(epoch.PhasePublisherCommit) + mean(epoch.PhasePublisherCertify)
	t.Logf("phases %v: publish %v, advance %v, at a publisher: commit %v, certify %v", count, publish, advance,
		mean(epoch.PhasePublisherCommit), mean(epoch.PhasePublisherCertify))
	farthest, nearest := c.Topology.RTT("us-central1", "us-west1"), c.Topology.RTT("us-central1", "us-east1")
	if publish < farthest {
		t.Errorf("mean publish %v, below the farthest publisher's RTT %v", publish, farthest)
	}
	if advance <= 0 || advance >= publish {
		t.Errorf("mean advance %v, want above 0 and below the mean publish %v: the service commits in its own region", advance, publish)
	}
	// Both publishers acknowledged every publish the service observed,
	// each after observing its own phases; the nodes are sampled one after
	// the other, so a round or two may land between them.
	if pubs, min := count[epoch.PhasePublisherCommit], 2*(count[epoch.PhasePublish]-2); pubs < min || count[epoch.PhasePublisherCertify] != pubs {
		t.Errorf("publishers observed %d commits and %d certifies for %d publishes, want at least %d of each",
			pubs, count[epoch.PhasePublisherCertify], count[epoch.PhasePublish], min)
	}
	if at <= 0 || at > publish-nearest+time.Millisecond {
		t.Errorf("at a publisher, commit + certify %v: want above 0 and within the publish %v less the nearest RTT %v", at, publish, nearest)
	}
}
