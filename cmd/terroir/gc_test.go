package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGCSettingsLeaveTheOperatorsChoice: with neither variable set the
// binary sets gcPercent and a quarter of the machine's memory; GOGC or
// GOMEMLIMIT set leaves that setting to the runtime, and so does a machine
// whose memory is unknown for the limit.
func TestGCSettingsLeaveTheOperatorsChoice(t *testing.T) {
	const gib = int64(1) << 30
	for _, c := range []struct {
		gogc, limit string
		machine     int64
		percent     int
		want        int64
	}{
		{"", "", 24 * gib, gcPercent, 6 * gib},
		{"50", "", 24 * gib, -1, 6 * gib},
		{"", "2GiB", 24 * gib, gcPercent, -1},
		{"off", "2GiB", 24 * gib, -1, -1},
		{"", "", 0, gcPercent, -1},
	} {
		p, l := gcSettings(c.gogc, c.limit, c.machine)
		if p != c.percent || l != c.want {
			t.Errorf("gcSettings(%q, %q, %d) = %d, %d; want %d, %d", c.gogc, c.limit, c.machine, p, l, c.percent, c.want)
		}
	}
}

// TestMachineMemoryReadsMeminfoAndTheCgroup: MemTotal is read in kB and
// returned in bytes; a file without it, or a malformed one, gives 0; a
// cgroup's memory.max is its bytes, "max" none.
func TestMachineMemoryReadsMeminfoAndTheCgroup(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got := memTotal(write("ok", "MemFree:  100 kB\nMemTotal:       24683664 kB\n")); got != 24683664<<10 {
		t.Errorf("memTotal = %d; want %d", got, int64(24683664)<<10)
	}
	for name, text := range map[string]string{"none": "MemFree: 100 kB\n", "bad": "MemTotal: lots kB\n", "unit": "MemTotal: 5 MB\n"} {
		if got := memTotal(write(name, text)); got != 0 {
			t.Errorf("memTotal of %q = %d; want 0", text, got)
		}
	}
	if got := memTotal(filepath.Join(dir, "missing")); got != 0 {
		t.Errorf("memTotal of a missing file = %d; want 0", got)
	}
	if got := cgroupMax("2147483648\n"); got != 2<<30 {
		t.Errorf("cgroupMax(2 GiB) = %d; want %d", got, 2<<30)
	}
	if got := cgroupMax("max\n"); got != 0 {
		t.Errorf("cgroupMax(max) = %d; want 0 (no limit)", got)
	}
	if got := machineMemory(); got <= 0 {
		t.Errorf("machineMemory() = %d on this machine; want its memory", got)
	}
}
