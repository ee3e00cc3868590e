package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime/trace"
	"testing"
	"time"
)

// TestDelayedProfileWritesOnlyAfterItsDelay: an execution trace started at
// once holds a trace when stopped, and one whose delay outlasts the run
// leaves its file empty and never starts (a later trace.Start succeeds).
func TestDelayedProfileWritesOnlyAfterItsDelay(t *testing.T) {
	dir := t.TempDir()
	open := func(name string) (*os.File, string) {
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		return f, path
	}

	f, path := open("now.trace")
	p := startProfileAfter(f, 0, trace.Start, trace.Stop)
	deadline := time.Now().Add(5 * time.Second)
	for !trace.IsEnabled() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !trace.IsEnabled() {
		t.Fatal("the trace with no delay did not start within 5 s")
	}
	p.stop()
	if trace.IsEnabled() {
		t.Fatal("the trace still runs after stop")
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte("go 1.")) || !bytes.Contains(got[:16], []byte(" trace")) {
		t.Fatalf("the trace file does not start with a trace header: %q", got[:min(len(got), 16)])
	}

	f, path = open("later.trace")
	p = startProfileAfter(f, time.Hour, trace.Start, trace.Stop)
	time.Sleep(50 * time.Millisecond) // time enough for a timer that ignored its delay to fire
	p.stop()
	if info, err := os.Stat(path); err != nil || info.Size() != 0 {
		t.Fatalf("a profile stopped before its delay wrote %v bytes (err %v); want an empty file", info.Size(), err)
	}
	if trace.IsEnabled() {
		t.Fatal("a profile stopped before its delay started a trace")
	}
}
