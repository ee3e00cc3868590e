package nemesis

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogRingKeepsTheLastInfoLines: the ring keeps the last lines logged
// at Info and above, oldest first, though the handler it wraps prints only
// warnings; it passes the warnings on, and keeps the attributes added with
// With.
func TestLogRingKeepsTheLastInfoLines(t *testing.T) {
	var printed bytes.Buffer
	ring := NewLogRing(slog.NewTextHandler(&printed, &slog.HandlerOptions{Level: slog.LevelWarn}), 3)
	log := slog.New(ring)
	log.Debug("not kept")
	for i := range 4 {
		log.Info("step", "n", i)
	}
	log.With("node", 7).Warn("slow")

	lines := ring.Lines()
	var got []string
	for _, l := range lines {
		if !strings.HasSuffix(l, "\n") {
			t.Errorf("line %q does not end in a newline", l)
		}
		got = append(got, strings.TrimSpace(l[strings.Index(l, "level="):]))
	}
	want := []string{`level=INFO msg=step n=2`, `level=INFO msg=step n=3`, `level=WARN msg=slow node=7`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("kept %q, want %q (the last three at Info and above, oldest first)", got, want)
	}
	if p := printed.String(); strings.Count(p, "\n") != 1 || !strings.Contains(p, "msg=slow node=7") {
		t.Errorf("printed %q, want the warning alone", p)
	}
}

// A campaign that found an anomaly writes the lines its LogRing kept to
// --out as log.txt, beside the seed.
func TestAFailedCampaignWritesItsLog(t *testing.T) {
	ring := NewLogRing(slog.DiscardHandler, 10)
	slog.New(ring).Info("rebalance: step failed", "range", 2000000002)
	dir := t.TempDir()
	cp := &campaign{cfg: Config{Out: dir, Log: ring, Seed: 60}, sum: &Summary{Anomalies: []string{"a drain past its bound"}}}
	if err := cp.dump(nil); err == nil || !strings.Contains(err.Error(), "1 anomalies (seed 60)") {
		t.Fatalf("dump = %v; want the anomalies' error", err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "log.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `msg="rebalance: step failed" range=2000000002`) {
		t.Errorf("log.txt holds %q; want the info line logged", got)
	}
}
