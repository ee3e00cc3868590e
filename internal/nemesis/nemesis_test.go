package nemesis

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/terroir-db/terroir/internal/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCampaign runs a short campaign with a fault every 2 s: it must inject
// faults, commit operations of every workload through them, and find no
// anomaly. NEMESIS_FAULTS (kinds joined by ",") narrows the faults.
func TestCampaign(t *testing.T) {
	var kinds []string
	if k := os.Getenv("NEMESIS_FAULTS"); k != "" {
		kinds = strings.Split(k, ",")
	}
	top, err := topology.Load("../../examples/three-regions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	top.GCTTL = 2 * time.Second // ranges collect while the faults strike
	var log strings.Builder
	sum, err := Run(context.Background(), Config{Topology: top, Duration: 15 * time.Second, Seed: 3,
		FaultEvery: 2 * time.Second, Faults: kinds, Out: t.TempDir()})
	if sum != nil {
		sum.Write(&log)
		t.Log("\n" + log.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	faults := 0
	for _, n := range sum.Faults {
		faults += n
	}
	if faults == 0 || sum.EpochReads == 0 {
		t.Fatalf("the campaign did too little: %d faults, %d epoch reads", faults, sum.EpochReads)
	}
	for _, kind := range []string{"transaction", "linearizable snapshot", "bank transfer", "bank audit", "register write",
		"register compare-and-set", "register read", "list append", "list read"} {
		n := 0
		for op, c := range sum.Ops {
			if strings.HasPrefix(op, kind) && strings.HasSuffix(op, "committed") {
				n += c
			}
		}
		if n == 0 {
			t.Errorf("no %s committed: operations %v", kind, sum.Ops)
		}
	}
}

// TestQuietSpellIdlesTheEpochs: a quiet spell holds every workload, so
// every data region's local epoch falls to its idle pace (and a range's
// Raft clock to its own, when GC leaves it a quiet second) before the
// range's leader is killed, and the campaign recovers with no anomaly. It fails if
// a workload kept asking for the epoch through the spells.
func TestQuietSpellIdlesTheEpochs(t *testing.T) {
	top, err := topology.Load("../../examples/three-regions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	sum, err := Run(context.Background(), Config{Topology: top, Duration: 12 * time.Second, Seed: 5,
		FaultEvery: 2 * time.Second, Faults: []string{faultQuietKill}, Out: t.TempDir()})
	if sum != nil {
		sum.Write(&log)
		t.Log("\n" + log.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	// A spell may end before the pace falls when a recovery under way asks
	// for the epoch (a replica taking over a lease); a workload that kept
	// asking would leave every spell at the full pace.
	if sum.Ops["quiet spell, epochs idle"] == 0 {
		t.Fatalf("quiet spells: %d idle, %d not idle; want the epochs idle in one at least",
			sum.Ops["quiet spell, epochs idle"], sum.Ops["quiet spell, epochs not idle"])
	}
	// The range's Raft clock idles in some spells only: at the campaign's
	// 3 s gc_ttl its leader proposes a GC chunk about every 2 s, and a
	// lease renewal every 4 s or so, each of which wakes it for a second
	// (raftgroup's TestIdleGroupsSlowTheirRaftClocks holds the idle pace).
	t.Logf("quiet spells: the range's Raft clock idle in %d, not in %d",
		sum.Ops["quiet spell, the range's Raft clock idle"], sum.Ops["quiet spell, the range's Raft clock not idle"])
	if len(sum.Anomalies) > 0 {
		t.Fatalf("anomalies: %q", sum.Anomalies)
	}
}

// TestEpochViolations: the epoch checks flag a group going back, a
// publisher serving two below a global epoch read before it, and the
// service returning less than a publisher showed before, and pass
// overlapping reads.
func TestEpochViolations(t *testing.T) {
	m := &epochMonitor{sources: []epochSource{
		{name: "us-east1 local"}, {name: "us-east1 publisher", global: true, pub: true},
		{name: "us-west1 publisher", global: true, pub: true}, {name: "global", global: true},
	}}
	m.reads = []epochRead{
		{Source: 0, Call: 0, Return: 10, Epoch: 5},
		{Source: 0, Call: 5, Return: 15, Epoch: 4},  // overlaps the first: fine
		{Source: 3, Call: 0, Return: 10, Epoch: 9},  // the service at 9
		{Source: 1, Call: 20, Return: 30, Epoch: 8}, // ≥ 9-1: fine
		{Source: 2, Call: 5, Return: 30, Epoch: 7},  // began before the service read returned: fine
	}
	if v := m.violations(); len(v) != 0 {
		t.Fatalf("a legal history reported %q", v)
	}
	m.reads = append(m.reads,
		epochRead{Source: 0, Call: 40, Return: 50, Epoch: 4}, // went back below 5
		epochRead{Source: 2, Call: 40, Return: 50, Epoch: 7}, // two below 9
		epochRead{Source: 1, Call: 60, Return: 70, Epoch: 10},
		epochRead{Source: 3, Call: 80, Return: 90, Epoch: 9}, // the service below what a publisher showed
	)
	v := strings.Join(m.violations(), "\n")
	if !strings.Contains(v, "us-east1 local went back from 5 to 4") || !strings.Contains(v, "us-west1 publisher served 7 after global had returned 9") ||
		!strings.Contains(v, "global returned 9 after us-east1 publisher had shown 10") {
		t.Fatalf("violations = %q", v)
	}
}

// TestFaultKindsNameable: every kind can be named in --faults (a list
// joined by commas) and NEMESIS_FAULTS.
func TestFaultKindsNameable(t *testing.T) {
	for _, k := range FaultKinds {
		if strings.Contains(k, ",") {
			t.Errorf("fault kind %q contains a comma: --faults cannot name it", k)
		}
	}
}

// TestSummaryPlacesAnomaliesAmongFaults: a summary with anomalies lists
// every fault drawn, in order, with whether it struck and when it healed;
// one without prints no timeline.
func TestSummaryPlacesAnomaliesAmongFaults(t *testing.T) {
	sum := &Summary{Seed: 1, Timeline: []FaultEvent{
		{Kind: faultDecommission, Began: 45 * time.Second},
		{Kind: faultRestartAll, Began: 108 * time.Second, Healed: 109500 * time.Millisecond, Struck: true},
		{Kind: faultDelay, Began: 112 * time.Second, Struck: true},
	}}
	var clean strings.Builder
	sum.Write(&clean)
	if strings.Contains(clean.String(), "faults in order") {
		t.Errorf("a summary without anomalies printed the timeline:\n%s", clean.String())
	}
	sum.Anomalies = []string{"registers: the history of 3 operations is not linearizable"}
	var out strings.Builder
	sum.Write(&out)
	for _, want := range []string{
		"faults in order (s since the campaign began):\n",
		"    45.000  " + faultDecommission + ": did not strike (nothing to strike, or it failed)\n" +
			"   108.000  " + faultRestartAll + ": healed at 109.500\n" +
			"   112.000  " + faultDelay + ": not healed\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the summary lacks %q:\n%s", want, out.String())
		}
	}
}
