package node_test

import (
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/experiment"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestGlobalEpochRoundPhasesExplainTheInterval: on the three-region
// topology (the service in us-central1; publishers 31 and 37 ms away) the
// nodes' terroir_global_epoch_round_seconds shows each round's publish
// taking at least the farthest publisher's RTT, the advance less than
// that and its commit a part of it, the service's nodes appending durably
// for each advance, and the publishers' own commit and certify within the
// publish less its nearest RTT: what an operator reads to see where the
// global epoch's interval goes.
func TestGlobalEpochRoundPhasesExplainTheInterval(t *testing.T) {
	c := startServing(t, "../../examples/three-regions.yaml", localcluster.Options{})
	const rounds = 10
	var r experiment.RoundPhases
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if r = experiment.SampleRounds(c); r.Count[epoch.PhasePublish] >= rounds && r.Count[epoch.PhaseAdvance] >= rounds {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s, rounds observed by phase: %v; want at least %d publishes and advances", r.Count, rounds)
		}
	}
	count, mean := r.Count, r.Mean
	publish, advance := mean(epoch.PhasePublish), mean(epoch.PhaseAdvance)
	at := mean(epoch.PhasePublisherCommit) + mean(epoch.PhasePublisherCertify)
	t.Logf("phases %v: publish %v, advance %v (commit %v), at a publisher: commit %v, certify %v", count, publish, advance,
		mean(epoch.PhaseAdvanceCommit), mean(epoch.PhasePublisherCommit), mean(epoch.PhasePublisherCertify))
	farthest, nearest := c.Topology.FarthestPublisherRTT(), c.Topology.RTT("us-central1", "us-east1")
	if farthest != 37*time.Millisecond || nearest != 31*time.Millisecond {
		t.Fatalf("the topology's RTTs from the service: farthest publisher %v, nearest %v; want 37 and 31 ms", farthest, nearest)
	}
	if publish < farthest {
		t.Errorf("mean publish %v, below the farthest publisher's RTT %v", publish, farthest)
	}
	if advance <= 0 || advance >= publish {
		t.Errorf("mean advance %v, want above 0 and below the mean publish %v: the service commits in its own region", advance, publish)
	}
	// Every advance observed its commit, a part of it, just before it (a
	// sample may land between the two).
	if n, commit := count[epoch.PhaseAdvanceCommit], mean(epoch.PhaseAdvanceCommit); n < count[epoch.PhaseAdvance] || n > count[epoch.PhaseAdvance]+1 || commit <= 0 || commit > advance {
		t.Errorf("%d advance commits of mean %v for %d advances of mean %v: want one each, within it",
			count[epoch.PhaseAdvanceCommit], commit, count[epoch.PhaseAdvance], advance)
	}
	// Each advance is a durable append on every replica of the service.
	if sync := r.ServiceSync; sync.Count < count[epoch.PhaseAdvance] || sync.Mean() <= 0 || r.ServiceApply.Count == 0 {
		t.Errorf("the service's nodes made %d durable appends of mean %v and %d applies for %d advances: want at least one append per advance",
			sync.Count, sync.Mean(), r.ServiceApply.Count, count[epoch.PhaseAdvance])
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
