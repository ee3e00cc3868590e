package main

import (
	"bufio"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// gcPercent is the binary's GOGC (debug.SetGCPercent) unless the
// environment sets GOGC: the heap may grow to four times what is live
// before the collector runs. A node's live heap is small (about 30 MB for
// the embedded three-node cluster under 16 clients; Pebble's block cache
// is not in it), so the cost is tens of MB, and the collector's share of
// the CPU goes from 9–10% to 4% (issue 17: at the runtime's 100, YCSB-A
// ran 0.94 collections per 1 000 operations, 22 µs of CPU each operation;
// at 300, 0.28 and 8 µs, and 7 151–7 189 ops/s became 7 490–7 648 in
// alternating 20-s runs).
const gcPercent = 300

// memoryShare is the share of the machine's memory (1/memoryShare) the
// binary's Go heap may reach before the collector runs more often than
// gcPercent asks (debug.SetMemoryLimit, a soft limit), unless the
// environment sets GOMEMLIMIT: so a large live heap (a big snapshot or
// restore in flight) does not grow fourfold into the memory Pebble, the
// page cache and other processes need.
const memoryShare = 4

// gcSettings returns the GC percent and the soft memory limit (bytes)
// the binary sets, given the GOGC and GOMEMLIMIT environment variables
// and the memory the machine gives the process (bytes; 0 if unknown):
// -1 for a setting it leaves as the runtime has it (the operator's, or
// no limit when the machine's memory is unknown).
func gcSettings(gogc, gomemlimit string, machine int64) (percent int, limit int64) {
	percent, limit = gcPercent, machine/memoryShare
	if gogc != "" {
		percent = -1
	}
	if gomemlimit != "" || machine <= 0 {
		limit = -1
	}
	return percent, limit
}

// tuneGC sets the runtime's GC percent and soft memory limit as
// gcSettings says. It is the binary's: main calls it once, before any
// command runs.
func tuneGC() {
	percent, limit := gcSettings(os.Getenv("GOGC"), os.Getenv("GOMEMLIMIT"), machineMemory())
	if percent >= 0 {
		debug.SetGCPercent(percent)
	}
	if limit >= 0 {
		debug.SetMemoryLimit(limit)
	}
}

// machineMemory returns the memory the process may use, in bytes: the
// machine's (/proc/meminfo's MemTotal), or its cgroup's limit
// (/sys/fs/cgroup/memory.max, cgroup v2) if that is lower; 0 if neither
// can be read.
func machineMemory() int64 {
	total := memTotal("/proc/meminfo")
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if limit := cgroupMax(string(b)); limit > 0 && (total == 0 || limit < total) {
			total = limit
		}
	}
	return total
}

// memTotal returns the MemTotal line of the meminfo file at path, in
// bytes (0 if the file or the line cannot be read).
func memTotal(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 3 && fields[0] == "MemTotal:" && fields[2] == "kB" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil || kb <= 0 {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// cgroupMax parses a cgroup v2 memory.max file: its limit in bytes, or 0
// for "max" (none) or anything it cannot read.
func cgroupMax(s string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
