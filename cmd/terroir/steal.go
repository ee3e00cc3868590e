package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// machineCPU is the machine's CPU time at one moment, summed over its
// CPUs, from the aggregate "cpu" line of /proc/stat (proc(5)), in clock
// ticks: total over every state, and steal, the time the hypervisor ran
// something else while a virtual CPU of this guest was ready to run.
// On a shared 2-core machine a minute can lose a tenth of the CPUs to it
// and the next a third, which moves a CPU-bound benchmark's throughput
// with it (issue 17's steady state). The zero value is no reading.
type machineCPU struct {
	total, steal uint64
}

// readMachineCPU reads /proc/stat. Errors: the file's, or parseMachineCPU's.
func readMachineCPU() (machineCPU, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	return parseMachineCPU(data)
}

// parseMachineCPU parses the first line of /proc/stat: "cpu" then user,
// nice, system, idle, iowait, irq, softirq and steal, in clock ticks (guest
// and guest_nice, which may follow, are already counted in user and nice).
// Errors name what is missing or malformed.
func parseMachineCPU(data []byte) (machineCPU, error) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) == 0 || fields[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("/proc/stat: the first line is not the aggregate cpu line: %q", line)
	}
	if len(fields) < 9 {
		return machineCPU{}, fmt.Errorf("/proc/stat: the cpu line has %d times, want at least 8 (through steal): %q", len(fields)-1, line)
	}
	var m machineCPU
	for i, f := range fields[1:9] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("/proc/stat: cpu time %q: %w", f, err)
		}
		m.total += n
		if i == 7 {
			m.steal = n
		}
	}
	return m, nil
}

// stolenSince returns the share (0–1) of the machine's CPU time between
// prev and m that the hypervisor took; ok is false when either is no
// reading or no time passed.
func (m machineCPU) stolenSince(prev machineCPU) (share float64, ok bool) {
	if prev.total == 0 || m.total <= prev.total || m.steal < prev.steal {
		return 0, false
	}
	return float64(m.steal-prev.steal) / float64(m.total-prev.total), true
}
