package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/terroir-db/terroir/internal/experiment"
)

// The benches count every Raft message a node sent, and the heartbeats
// and their replies among them, from terroir_raft_messages_sent_total's
// type label; other families count no heartbeats.
func TestHeartbeatsSentCountsHeartbeatsAndTheirReplies(t *testing.T) {
	const exposition = `# TYPE terroir_raft_messages_sent_total counter
terroir_raft_messages_sent_total{type="MsgApp"} 40
terroir_raft_messages_sent_total{type="MsgAppResp"} 38
terroir_raft_messages_sent_total{type="MsgHeartbeat"} 7
terroir_raft_messages_sent_total{type="MsgHeartbeatResp"} 6
terroir_raft_messages_sent_total{type="MsgReadIndex"} 1
# TYPE terroir_raft_proposals_total counter
terroir_raft_proposals_total 9
`
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	sent := mfs["terroir_raft_messages_sent_total"]
	if got := heartbeatsSent(sent); got != 13 {
		t.Errorf("heartbeatsSent = %v, want 13 (7 heartbeats and 6 replies)", got)
	}
	if got := sumMetric(sent); got != 92 {
		t.Errorf("sumMetric = %v, want all 92 messages", got)
	}
	if got := heartbeatsSent(mfs["terroir_raft_proposals_total"]); got != 0 {
		t.Errorf("heartbeatsSent of another family = %v, want 0", got)
	}
}

// TestEpochReadsBetweenAreMeansOfTheDifference: the wait is per read and
// the round time per round, both over what happened between the samples
// only; no reads or no rounds between them is no figure.
func TestEpochReadsBetweenAreMeansOfTheDifference(t *testing.T) {
	before := runCost{epochReads: 100, epochRounds: 50, epochWaited: 1, epochInRounds: 2}
	after := runCost{epochReads: 300, epochRounds: 150, epochWaited: 1.02, epochInRounds: 2.014}
	r, ok := epochReadsBetween(before, after)
	if !ok || r.reads != 200 || r.rounds != 100 || math.Abs(r.waitMS-0.1) > 1e-9 || math.Abs(r.roundMS-0.14) > 1e-9 {
		t.Errorf("epochReadsBetween = %+v, %v; want 200 reads, 100 rounds, 0.1 ms waited, 0.14 ms a round", r, ok)
	}
	if _, ok := epochReadsBetween(after, after); ok {
		t.Error("a figure from no reads")
	}
	if _, ok := epochReadsBetween(runCost{epochReads: 1}, runCost{epochReads: 5, epochRounds: 0}); ok {
		t.Error("a figure from no rounds")
	}
}

func TestDeviceWritesArePerOperationAndPerSecond(t *testing.T) {
	at := time.Now()
	before := runCost{at: at, device: experiment.DeviceWrites{Requests: 1000}, deviceOK: true}
	after := runCost{at: at.Add(2 * time.Second), device: experiment.DeviceWrites{Requests: 9000}, deviceOK: true}
	if got, want := deviceWrites(before, after, 4000), "; the device's write requests 2.00 (4000/s, every process's)"; got != want {
		t.Errorf("8000 requests over 2 s and 4000 operations: %q; want %q", got, want)
	}
	for name, tc := range map[string]struct {
		before, after runCost
		ops           int64
	}{
		"no device before":   {runCost{at: at}, after, 4000},
		"no device after":    {before, runCost{at: at.Add(time.Second)}, 4000},
		"no operation":       {before, after, 0},
		"no time in between": {before, runCost{at: at, device: after.device, deviceOK: true}, 4000},
	} {
		if got := deviceWrites(tc.before, tc.after, tc.ops); got != "" {
			t.Errorf("%s: %q; want nothing", name, got)
		}
	}
}

func TestKernelShareIsPerOperation(t *testing.T) {
	before := runCost{cpu: time.Second, sys: 200 * time.Millisecond, calls: syscalls{reads: 100, writes: 50}, callsOK: true}
	after := runCost{cpu: 3 * time.Second, sys: 1200 * time.Millisecond, calls: syscalls{reads: 7100, writes: 5050}, callsOK: true}
	if got, want := kernelShare(before, after, 1000), "50% in the kernel, system calls 7.00 reads and 5.00 writes"; got != want {
		t.Errorf("1 s of 2 in the kernel, 7000 reads and 5000 writes over 1000 operations: %q; want %q", got, want)
	}
	noCalls := after
	noCalls.callsOK = false
	if got, want := kernelShare(before, noCalls, 1000), "50% in the kernel"; got != want {
		t.Errorf("without /proc/self/io after: %q; want %q", got, want)
	}
	if got, want := kernelShare(before, before, 1000), "no CPU time measured"; got != want {
		t.Errorf("no CPU in between: %q; want %q", got, want)
	}
}
