package main

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// burnCPU spins this goroutine until selfCPU has grown by d.
func burnCPU(d time.Duration) {
	start := selfCPU()
	x := 1
	for selfCPU()-start < d {
		for i := 0; i < 1e5; i++ {
			x = x*31 + i
		}
	}
	_ = x
}

func TestProcCPUReadsTheProcessCPUTime(t *testing.T) {
	pid := os.Getpid()
	before, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	burnCPU(200 * time.Millisecond)
	after, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// At least the burn, less a tick of rounding at each end.
	if got := after - before; got < 200*time.Millisecond-20*time.Millisecond {
		t.Fatalf("procCPU grew by %v over a 200ms burn of CPU", got)
	}
	// /proc and getrusage count the same thing: they agree to a few ticks,
	// which also checks the 100 Hz tick.
	self, proc := selfCPU(), after
	if diff := (self - proc).Abs(); diff > 50*time.Millisecond+self/20 {
		t.Fatalf("procCPU = %v, getrusage = %v", proc, self)
	}
	sum, err := procsCPU([]int{pid, pid})
	if err != nil || sum < 2*after {
		t.Fatalf("procsCPU of the pid twice = %v, %v; want at least 2 × %v", sum, err, after)
	}
}

func TestProcCPUOfNoProcess(t *testing.T) {
	// A child that has exited and been reaped leaves no /proc entry.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no `true` to run:", err)
	}
	gone := cmd.ProcessState.Pid()
	if _, err := procCPU(gone); !errors.Is(err, errNoProcess) || !strings.Contains(err.Error(), strconv.Itoa(gone)) {
		t.Fatalf("procCPU of exited pid %d = %v, want errNoProcess naming it", gone, err)
	}
	if _, err := procsCPU([]int{os.Getpid(), gone}); !errors.Is(err, errNoProcess) {
		t.Fatalf("procsCPU with an exited pid = %v, want errNoProcess", err)
	}
}

func TestParsePids(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	pids, err := parsePids("cluster-pids", " "+self+" ")
	if err != nil || len(pids) != 1 || pids[0] != os.Getpid() {
		t.Fatalf("parsePids(self) = %v, %v", pids, err)
	}
	if pids, err := parsePids("cluster-pids", ""); err != nil || pids != nil {
		t.Fatalf("parsePids(\"\") = %v, %v; want none", pids, err)
	}
	for _, bad := range []string{"abc", "1,,2", "-3", "0", self + ",x"} {
		if _, err := parsePids("target-pids", bad); err == nil || !strings.Contains(err.Error(), "--target-pids") || !strings.Contains(err.Error(), "not a process id") {
			t.Errorf("parsePids(%q) = %v, want an error that it is not a process id", bad, err)
		}
	}
	if _, err := parsePids("target-pids", self+","+self); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("parsePids of a pid twice = %v, want an error", err)
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no `true` to run:", err)
	}
	if _, err := parsePids("target-pids", self+","+strconv.Itoa(cmd.ProcessState.Pid())); !errors.Is(err, errNoProcess) {
		t.Errorf("parsePids with an exited pid = %v, want errNoProcess", err)
	}
}

func TestParseProcStat(t *testing.T) {
	// A command with spaces and parentheses; utime 250, stime 50 ticks.
	line := "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 5 1000 10\n"
	got, err := parseProcStat(42, []byte(line))
	if err != nil || got != 3*time.Second {
		t.Fatalf("parseProcStat = %v, %v; want 3s", got, err)
	}
	for _, bad := range []string{"42 no-parens S 1", "42 (x) S 1 2 3", "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 ten 50 0"} {
		if _, err := parseProcStat(42, []byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q) succeeded", bad)
		}
	}
}

func TestYCSBRejectsBadPidsBeforeRunning(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--target", "etcd://127.0.0.1:1", "--target-pids", "x"}, "not a process id"},
		{[]string{"--target-pids", "1"}, "--target-pids needs --target"},
		{[]string{"--cluster-pids", "1"}, "--cluster-pids needs --cluster"},
		{[]string{"--cluster", "no-such.yaml", "--cluster-pids", "1,y"}, "not a process id"},
		{[]string{"--every", "-1s"}, "must not be negative"},
	} {
		start := time.Now()
		err := run(append([]string{"bench", "ycsb", "--duration", "1s"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench ycsb %v = %v, want an error containing %q", tc.args, err, tc.want)
		}
		if time.Since(start) > 2*time.Second {
			t.Errorf("bench ycsb %v took %v to fail: it ran something first", tc.args, time.Since(start))
		}
	}
}

// TestParseProcIO reads syscr and syscw from a /proc/<pid>/io as Linux
// writes it, and rejects one that lacks either or holds no number.
func TestParseProcIO(t *testing.T) {
	const io = "rchar: 1948\nwchar: 512\nsyscr: 7\nsyscw: 3\nread_bytes: 0\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n"
	got, err := parseProcIO([]byte(io))
	if err != nil || got != (syscalls{reads: 7, writes: 3}) {
		t.Fatalf("parseProcIO = %+v, %v; want 7 reads and 3 writes", got, err)
	}
	for name, bad := range map[string]string{
		"no syscw":     "rchar: 1\nsyscr: 7\n",
		"no syscr":     "syscw: 3\n",
		"not a number": "syscr: seven\nsyscw: 3\n",
		"empty":        "",
		"negative":     "syscr: -1\nsyscw: 3\n",
	} {
		if s, err := parseProcIO([]byte(bad)); err == nil {
			t.Errorf("%s: parseProcIO(%q) = %+v with no error", name, bad, s)
		}
	}
}

// TestSelfSyscallsCountTheProcessWrites: 100 writes to a file show as at
// least 100 more write system calls of this process.
func TestSelfSyscallsCountTheProcessWrites(t *testing.T) {
	if _, err := os.Stat("/proc/self/io"); err != nil {
		t.Skipf("no /proc/self/io here: %v", err)
	}
	before, ok := selfSyscalls()
	if !ok {
		t.Fatal("/proc/self/io exists but selfSyscalls could not read it")
	}
	f, err := os.Create(t.TempDir() + "/w")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 100 {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	after, ok := selfSyscalls()
	if !ok {
		t.Fatal("/proc/self/io became unreadable")
	}
	if n := after.writes - before.writes; n < 100 {
		t.Errorf("100 writes counted as %d write system calls", n)
	}
}
