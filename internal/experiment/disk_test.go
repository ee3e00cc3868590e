package experiment

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// diskstats is /proc/diskstats as this machine's kernel writes it: loop
// devices, a disk (254:0) and its partition (254:1), one line cut short
// and one with a count that is not a number.
const diskstats = `   7       0 loop0 10 0 20 1 0 0 0 0 0 4 1 0 0 0 0 0 0
 254       0 vda 901408 225034 61230866 691332 32195165 1150523 340927200 4878339 0 2726204 7384378 345179 109 618104152 114542 11807142 1700162
 254       1 vda1 1200 0 9600 12 5500 10 88000 40 0 30 52 0 0 0 0 0 0
 254       2 vda2 1 2 3
 254       3 vda3 1 0 8 1 x 0 16 1 0 1 2 0 0 0 0 0 0
`

func TestDiskstatsGiveTheDevicesWrites(t *testing.T) {
	for _, tc := range []struct {
		name         string
		major, minor uint32
		want         DeviceWrites
		ok           bool
	}{
		{"a disk", 254, 0, DeviceWrites{Requests: 32195165, Bytes: 340927200 * 512}, true},
		{"its partition", 254, 1, DeviceWrites{Requests: 5500, Bytes: 88000 * 512}, true},
		{"a loop device", 7, 0, DeviceWrites{}, true},
		{"a line cut short", 254, 2, DeviceWrites{}, false},
		{"a count not a number", 254, 3, DeviceWrites{}, false},
		{"a device not listed", 8, 0, DeviceWrites{}, false},
	} {
		got, ok := parseDiskstats([]byte(diskstats), tc.major, tc.minor)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s (%d:%d): %+v, %v; want %+v, %v", tc.name, tc.major, tc.minor, got, ok, tc.want, tc.ok)
		}
	}
}

// TestWatchDeviceCountsSyncedWrites syncs 4 KiB writes in a directory on
// a block device for a little over a second: the watch must count at
// least one write request a second for each of them.
func TestWatchDeviceCountsSyncedWrites(t *testing.T) {
	dir := t.TempDir()
	if _, ok := ReadDeviceWrites(dir); !ok {
		t.Skipf("%s is on no block device /proc/diskstats lists", dir)
	}
	f, err := os.Create(filepath.Join(dir, "synced"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	load := WatchDevice(ctx, dir)
	buf := make([]byte, 4096)
	synced := 0
	for began := time.Now(); time.Since(began) < 1100*time.Millisecond; synced++ {
		if _, err := f.WriteAt(buf, int64(synced%256)*4096); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	got, ok := load()
	if !ok || got.Seconds != 1 {
		t.Fatalf("watched %d seconds (ok %v); want 1", got.Seconds, ok)
	}
	if got.MeanRequests < float64(synced)/1.1*0.5 || got.PeakRequests < got.MeanRequests || got.MeanBytes < float64(synced)/1.1*4096*0.5 {
		t.Fatalf("%d synced 4-KiB writes in 1.1 s read as %+v", synced, got)
	}
	t.Logf("%d synced writes: %s", synced, got)
}
