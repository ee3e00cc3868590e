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
