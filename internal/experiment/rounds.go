package experiment

import (
	"fmt"
	"io"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

// roundMetric is the nodes' histogram of the global epoch's round phases
// (epoch.RoundObserver, node metrics).
const roundMetric = "terroir_global_epoch_round_seconds"

// The raftgroup histograms of a node's durable appends (its fsyncs) and
// applies, over all its replicas.
const (
	appendSyncMetric = "terroir_raft_append_sync_seconds"
	applyMetric      = "terroir_raft_apply_seconds"
)

// RoundPhases is what the global epoch's rounds spent in each phase over
// a run (epoch.Phase, DESIGN.md §7), from every node's
// terroir_global_epoch_round_seconds: it explains the global epoch
// interval (issue 17: the interval's floor is the farthest publisher's
// RTT).
type RoundPhases struct {
	// Count and Total are, by epoch.Phase, how many phases ran during the
	// run and their summed duration.
	Count [epoch.NumPhases]uint64
	Total [epoch.NumPhases]time.Duration
	// FarthestRTT is the largest round trip between the service and a
	// publisher (topology.FarthestPublisherRTT).
	FarthestRTT time.Duration
	// ServiceSync and ServiceApply are the durable appends (each an
	// fsync) and the applies of the nodes the topology names as the global
	// epoch service's replicas, over all their replicas (none counted for
	// a service whose replicas the topology leaves to placement): what the
	// advance's commit waits for on its leader and followers.
	ServiceSync, ServiceApply Summed
	// MeasuredRTT is the P50 of a Ping from the service's region to the
	// farthest publisher's region during the run (0: not measured): the
	// configured delay plus what the loaded machine adds to any call, its
	// timers' lateness and the loopback call itself, which a publish pays
	// too.
	MeasuredRTT time.Duration
}

// Summed is a histogram's sample count and summed duration.
type Summed struct {
	Count uint64
	Total time.Duration
}

// Mean returns the mean duration (0 with no samples).
func (s Summed) Mean() time.Duration {
	if s.Count == 0 {
		return 0
	}
	return s.Total / time.Duration(s.Count)
}

// summed is histogram h's sample count and sum.
func summed(h *dto.Histogram) Summed {
	return Summed{Count: h.GetSampleCount(), Total: time.Duration(h.GetSampleSum() * float64(time.Second))}
}

// plus returns s and o summed.
func (s Summed) plus(o Summed) Summed {
	return Summed{Count: s.Count + o.Count, Total: s.Total + o.Total}
}

// minus returns what s holds beyond an earlier sample.
func (s Summed) minus(earlier Summed) Summed {
	return Summed{Count: s.Count - earlier.Count, Total: s.Total - earlier.Total}
}

// Mean returns phase p's mean duration (0 if none ran).
func (r RoundPhases) Mean(p epoch.Phase) time.Duration {
	if p >= epoch.NumPhases || r.Count[p] == 0 {
		return 0
	}
	return r.Total[p] / time.Duration(r.Count[p])
}

// SampleRounds sums the round phases every running node of c has
// observed so far, and the appends and applies of the global epoch
// service's nodes; a run's are the difference of two samples (since). Each
// node's metrics are gathered once.
func SampleRounds(c *localcluster.Cluster) RoundPhases {
	var service []uint64
	for _, g := range c.Topology.GroupsOfKind(topology.KindGlobalEpoch, "") {
		service = append(service, g.Replicas...)
	}
	var r RoundPhases
	for _, id := range c.NodeIDs() {
		ofService := slices.Contains(service, id)
		c.NodeMetricFamilies(id, func(mf *dto.MetricFamily) {
			switch {
			case mf.GetName() == roundMetric:
				r.addPhases(mf)
			case !ofService || len(mf.GetMetric()) == 0: // not the service's, or no sample
			case mf.GetName() == appendSyncMetric:
				r.ServiceSync = r.ServiceSync.plus(summed(mf.GetMetric()[0].GetHistogram()))
			case mf.GetName() == applyMetric:
				r.ServiceApply = r.ServiceApply.plus(summed(mf.GetMetric()[0].GetHistogram()))
			}
		})
	}
	return r
}

// addPhases adds a node's terroir_global_epoch_round_seconds, by its
// phase label, to r.
func (r *RoundPhases) addPhases(mf *dto.MetricFamily) {
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			for p := range epoch.NumPhases {
				if l.GetName() == "phase" && l.GetValue() == p.String() {
					s := summed(m.GetHistogram())
					r.Count[p] += s.Count
					r.Total[p] += s.Total
				}
			}
		}
	}
}

// since returns what r holds beyond an earlier sample.
func (r RoundPhases) since(earlier RoundPhases) RoundPhases {
	var out RoundPhases
	for p := range r.Count {
		out.Count[p] = r.Count[p] - earlier.Count[p]
		out.Total[p] = r.Total[p] - earlier.Total[p]
	}
	out.ServiceSync = r.ServiceSync.minus(earlier.ServiceSync)
	out.ServiceApply = r.ServiceApply.minus(earlier.ServiceApply)
	return out
}

// write prints the phases' means: the service's publish (the farthest
// publisher's RTT and its commit and certify) and advance (its commit and
// certify).
func (r RoundPhases) write(w io.Writer) {
	if r.Count[epoch.PhasePublish] == 0 {
		return
	}
	measured := ""
	if r.MeasuredRTT > 0 {
		measured = ", measured under the run's load P50 " + ms(r.MeasuredRTT)
	}
	advance, commit := r.Mean(epoch.PhaseAdvance), r.Mean(epoch.PhaseAdvanceCommit)
	fmt.Fprintf(w, "%-40s publish %s (farthest publisher's RTT %s%s; at a publisher: commit %s, certify %s), advance %s (commit %s, certify %s)\n",
		"global epoch round, mean ms", ms(r.Mean(epoch.PhasePublish)), ms(r.FarthestRTT), measured,
		ms(r.Mean(epoch.PhasePublisherCommit)), ms(r.Mean(epoch.PhasePublisherCertify)), ms(advance), ms(commit), ms(max(advance-commit, 0)))
	if r.ServiceSync.Count > 0 {
		fmt.Fprintf(w, "%-40s append with fsync %s (%d), apply %s (%d)\n", "global epoch service's nodes, mean ms",
			ms(r.ServiceSync.Mean()), r.ServiceSync.Count, ms(r.ServiceApply.Mean()), r.ServiceApply.Count)
	}
}
