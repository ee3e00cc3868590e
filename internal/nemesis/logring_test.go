package nemesis

import (
	"bytes"
	"fmt"
	"log/slog"
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
