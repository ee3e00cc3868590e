package experiment

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// DeviceWrites is what a block device had written by one moment, from
// Linux's /proc/diskstats: write requests completed and bytes written
// (sectors of 512 B), by every process on the machine, not this one
// alone.
//
// The benchmarks print it (issue 17) because this machine's disk
// throttles write requests. A program writing 4 KiB and fdatasyncing it in
// a loop (two write requests a sync: the data and the flush) ran 15 000
// requests a second from one file, 3 of its 20 000 syncs over 3 ms; from two or
// three files at once it reached 21 000–23 000 a second, and then every
// request stalled 16–21 ms each 100 ms. Large writes ran 230–360 MiB/s
// without a stall: the cap is on requests, not bytes. A run near it has
// tails that are the disk's, not Terroir's; the figure says how near.
type DeviceWrites struct {
	// Requests is the write requests completed; Bytes the bytes written.
	Requests, Bytes uint64
}

// sectorBytes is the unit of /proc/diskstats' sector counts: 512 bytes,
// whatever the device's own sector size.
const sectorBytes = 512

// ReadDeviceWrites returns the counts of the block device that holds dir,
// and false when there is none /proc/diskstats lists (a tmpfs or overlay
// directory, or not Linux).
func ReadDeviceWrites(dir string) (DeviceWrites, bool) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return DeviceWrites{}, false
	}
	data, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return DeviceWrites{}, false
	}
	return parseDiskstats(data, unix.Major(st.Dev), unix.Minor(st.Dev))
}

// parseDiskstats finds device major:minor in data, /proc/diskstats'
// contents: per line the major and minor numbers, the name, then reads
// completed, reads merged, sectors read, ms reading, writes completed,
// writes merged and sectors written (Documentation/admin-guide/iostats.rst).
// A line too short or not numeric where it counts is skipped.
func parseDiskstats(data []byte, major, minor uint32) (DeviceWrites, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 10 {
			continue
		}
		maj, err1 := strconv.ParseUint(string(f[0]), 10, 32)
		min, err2 := strconv.ParseUint(string(f[1]), 10, 32)
		if err1 != nil || err2 != nil || uint32(maj) != major || uint32(min) != minor {
			continue
		}
		writes, err1 := strconv.ParseUint(string(f[7]), 10, 64)
		sectors, err2 := strconv.ParseUint(string(f[9]), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		return DeviceWrites{Requests: writes, Bytes: sectors * sectorBytes}, true
	}
	return DeviceWrites{}, false
}

// DeviceLoad is a block device's write load over a run, sampled once a
// second (WatchDevice): the mean write requests a second, the busiest
// second's, and the mean bytes a second.
type DeviceLoad struct {
	// Seconds is how many one-second samples were taken (0: none; the
	// other fields are then zero). Each rate is per second of the time
	// between its samples.
	Seconds int
	// MeanRequests and PeakRequests are write requests a second: over the
	// run, and in its busiest second.
	MeanRequests, PeakRequests float64
	// MeanBytes is bytes written a second over the run.
	MeanBytes float64
}

// WatchDevice samples the device holding dir (ReadDeviceWrites) every
// second until ctx ends, and returns a function that waits for that end
// and gives the load; it reports false when dir is on no device
// /proc/diskstats lists. The returned function must be called, once, for
// the sampling goroutine to be waited for.
func WatchDevice(ctx context.Context, dir string) func() (DeviceLoad, bool) {
	first, ok := ReadDeviceWrites(dir)
	if !ok {
		return func() (DeviceLoad, bool) { return DeviceLoad{}, false }
	}
	done := make(chan DeviceLoad, 1)
	began := time.Now()
	go func() {
		var load DeviceLoad
		last, lastAt := first, began
		everyTick(ctx, time.Second, func() {
			now, ok := ReadDeviceWrites(dir)
			at := time.Now()
			if !ok {
				return // the next sample's second spans this one too
			}
			load.Seconds++
			load.PeakRequests = max(load.PeakRequests, float64(now.Requests-last.Requests)/at.Sub(lastAt).Seconds())
			last, lastAt = now, at
		})
		if secs := lastAt.Sub(began).Seconds(); load.Seconds > 0 {
			load.MeanRequests = float64(last.Requests-first.Requests) / secs
			load.MeanBytes = float64(last.Bytes-first.Bytes) / secs
		}
		done <- load
	}()
	return func() (DeviceLoad, bool) { return <-done, true }
}

// String gives the load as the benchmarks print it: write requests a
// second (mean, and the busiest second's) and MiB a second, over how many
// seconds.
func (l DeviceLoad) String() string {
	if l.Seconds == 0 {
		return "no second sampled"
	}
	return fmt.Sprintf("%.0f write requests/s (busiest second %.0f), %.1f MiB/s, over %d s",
		l.MeanRequests, l.PeakRequests, l.MeanBytes/(1<<20), l.Seconds)
}
