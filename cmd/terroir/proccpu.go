package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicksPerSecond is the unit of the utime and stime fields of
// /proc/<pid>/stat: USER_HZ, which sysconf(_SC_CLK_TCK) returns. Linux fixes
// it at 100 on every architecture Go runs on, whatever the kernel's HZ, so
// one tick is 10 ms.
const clockTicksPerSecond = 100

// errNoProcess is returned (wrapped, naming the pid) for a pid that has no
// /proc/<pid>/stat: no such process, or it exited.
var errNoProcess = errors.New("no such process")

// parsePids parses a comma-separated list of process ids ("" is none) and
// checks that each names a running process whose CPU time can be read, so
// that a wrong --target-pids or --cluster-pids fails before any benchmark
// runs. flag names the flag in the errors.
func parsePids(flag, list string) ([]int, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var pids []int
	seen := map[int]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		pid, err := strconv.Atoi(s)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("--%s: %q is not a process id (a positive integer)", flag, s)
		}
		if seen[pid] {
			return nil, fmt.Errorf("--%s: pid %d is listed twice (its CPU would count twice)", flag, pid)
		}
		seen[pid] = true
		if _, err := procCPU(pid); err != nil {
			return nil, fmt.Errorf("--%s: %w", flag, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// procCPU returns the CPU time (user + system, all of its threads) that
// process pid has used since it started, from /proc/<pid>/stat, to the
// resolution of one clock tick (10 ms). A pid with no such file gives an
// error that wraps errNoProcess.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return 0, fmt.Errorf("pid %d: %w", pid, errNoProcess)
	}
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return parseProcStat(pid, data)
}

// parseProcStat returns utime + stime of a /proc/<pid>/stat line. Its second
// field, the command in parentheses, may hold spaces and parentheses, so
// the fields are counted from the last ')': state is field 3, utime 14 and
// stime 15 (proc(5)), in clock ticks.
func parseProcStat(pid int, data []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: /proc/%d/stat has no command field: %q", pid, pid, data)
	}
	fields := strings.Fields(string(data[i+1:])) // fields[0] is field 3
	if len(fields) < 13 {
		return 0, fmt.Errorf("pid %d: /proc/%d/stat has %d fields, want at least 15", pid, pid, len(fields)+2)
	}
	var ticks uint64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("pid %d: /proc/%d/stat: CPU time %q: %w", pid, pid, f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicksPerSecond, nil
}

// procsCPU returns the sum of procCPU over pids.
func procsCPU(pids []int) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range pids {
		d, err := procCPU(pid)
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// selfCPU returns the CPU time (user + system) this process has used, from
// getrusage(RUSAGE_SELF), to the microsecond.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuSample is the CPU time, at one moment, of the processes serving a
// benchmark and of the driver (this process).
type cpuSample struct {
	servers, driver time.Duration
}

// sampleCPU reads the CPU time of pids and of this process.
func sampleCPU(pids []int) (cpuSample, error) {
	servers, err := procsCPU(pids)
	if err != nil {
		return cpuSample{}, fmt.Errorf("reading the CPU time of the servers' processes: %w", err)
	}
	return cpuSample{servers: servers, driver: selfCPU()}, nil
}

// cpuPerOp is what one operation of a run cost in CPU time: in the
// servers' processes (procs of them) and in the driver.
type cpuPerOp struct {
	servers, driver time.Duration
	procs           int
}

// perOp divides the CPU spent between two samples over ops operations; it
// is zero for no operations.
func perOp(before, after cpuSample, procs int, ops int64) cpuPerOp {
	if ops <= 0 {
		return cpuPerOp{procs: procs}
	}
	return cpuPerOp{servers: (after.servers - before.servers) / time.Duration(ops),
		driver: (after.driver - before.driver) / time.Duration(ops), procs: procs}
}

// String prints the cost in microseconds.
func (c cpuPerOp) String() string {
	procs := fmt.Sprintf("its %d processes", c.procs)
	if c.procs == 1 {
		procs = "its 1 process"
	}
	return fmt.Sprintf("CPU per operation: %s (%s); driver %s", micros(c.servers), procs, micros(c.driver))
}

// micros formats d in whole microseconds.
func micros(d time.Duration) string {
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

// syscalls is how many read-like and write-like system calls a process
// has made since it started (/proc/<pid>/io's syscr and syscw: read,
// recvmsg, pread and the like; write, sendmsg, pwrite; an fsync is
// neither).
type syscalls struct{ reads, writes uint64 }

// selfSyscalls returns this process's syscalls, and false where
// /proc/self/io cannot be read or parsed.
func selfSyscalls() (syscalls, bool) {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return syscalls{}, false
	}
	s, err := parseProcIO(data)
	return s, err == nil
}

// parseProcIO reads syscr and syscw from /proc/<pid>/io's "name: value"
// lines. Errors: either line missing or not a number.
func parseProcIO(data []byte) (syscalls, error) {
	var s syscalls
	var found int
	for _, line := range strings.Split(string(data), "\n") {
		name, value, ok := strings.Cut(line, ":")
		var dst *uint64
		switch {
		case !ok:
			continue
		case name == "syscr":
			dst = &s.reads
		case name == "syscw":
			dst = &s.writes
		default:
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return syscalls{}, fmt.Errorf("/proc io: %s: %q is not a count: %w", name, strings.TrimSpace(value), err)
		}
		*dst = n
		found++
	}
	if found != 2 {
		return syscalls{}, fmt.Errorf("/proc io: want syscr and syscw, found %d of them in %q", found, data)
	}
	return s, nil
}
