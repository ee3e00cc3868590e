package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/terroir-db/terroir/internal/topology"
)

func run(args ...string) error {
	cmd := rootCmd()
	cmd.SetArgs(args)
	return cmd.Execute()
}

func TestDemoRunsAndStops(t *testing.T) {
	if err := run("demo", "--duration", "1500ms", "--readers", "2"); err != nil {
		t.Fatal(err)
	}
}

func TestStartRejectsBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("regions: [a]\nnodes:\n  - {id: 1, region: b, addr: \"127.0.0.1:1\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run("start", "--config", bad, "--node", "1", "--data-dir", t.TempDir())
	if !errors.Is(err, topology.ErrInvalid) || !strings.Contains(err.Error(), `unknown region "b"`) {
		t.Fatalf("start with a bad topology = %v, want an invalid-topology error naming region b", err)
	}
	err = run("start", "--config", "../../examples/one-region.yaml", "--node", "9", "--data-dir", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "--node 9 is not in") {
		t.Fatalf("start with an unknown node = %v", err)
	}
}
