package experiment

import (
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
)

// TestRoundPhasesOfARunAreTheDifference: a run's phases and the service's
// appends are the later sample less the earlier, and the report gives the
// advance's commit and certify (the advance less its commit) and the
// service's mean append and apply.
func TestRoundPhasesOfARunAreTheDifference(t *testing.T) {
	var before, after RoundPhases
	before.Count[epoch.PhasePublish], before.Total[epoch.PhasePublish] = 10, 400*time.Millisecond
	before.Count[epoch.PhaseAdvance], before.Total[epoch.PhaseAdvance] = 10, 30*time.Millisecond
	before.Count[epoch.PhaseAdvanceCommit], before.Total[epoch.PhaseAdvanceCommit] = 10, 20*time.Millisecond
	before.ServiceSync, before.ServiceApply = Summed{30, 30 * time.Millisecond}, Summed{30, 3 * time.Millisecond}
	after = before
	after.Count[epoch.PhasePublish], after.Total[epoch.PhasePublish] = 20, 800*time.Millisecond
	after.Count[epoch.PhaseAdvance], after.Total[epoch.PhaseAdvance] = 20, 70*time.Millisecond
	after.Count[epoch.PhaseAdvanceCommit], after.Total[epoch.PhaseAdvanceCommit] = 20, 45*time.Millisecond
	after.ServiceSync, after.ServiceApply = Summed{60, 90 * time.Millisecond}, Summed{60, 6 * time.Millisecond}

	run := after.since(before)
	if got := run.Mean(epoch.PhaseAdvance); got != 4*time.Millisecond {
		t.Errorf("advance mean %v, want 4ms (40 ms over 10)", got)
	}
	if got := run.Mean(epoch.PhaseAdvanceCommit); got != 2500*time.Microsecond {
		t.Errorf("advance commit mean %v, want 2.5ms (25 ms over 10)", got)
	}
	if got := run.ServiceSync; got != (Summed{30, 60 * time.Millisecond}) || got.Mean() != 2*time.Millisecond {
		t.Errorf("service appends %+v (mean %v), want 30 of 60 ms, mean 2ms", got, got.Mean())
	}
	var b strings.Builder
	run.FarthestRTT = 37 * time.Millisecond
	run.write(&b)
	for _, want := range []string{"advance 4.000 (commit 2.500, certify 1.500)", "append with fsync 2.000 (30), apply 0.100 (30)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
	if (Summed{}).Mean() != 0 {
		t.Error("an empty sum's mean is not 0")
	}
}
