package topology

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

const twoRegions = `
regions: [east, west]
rtt:
  - {between: [east, west], ms: 60}
nodes:
  - {id: 1, region: east, addr: "127.0.0.1:1"}
  - {id: 2, region: east, addr: "127.0.0.1:2"}
  - {id: 3, region: east, addr: "127.0.0.1:3"}
  - {id: 4, region: west, addr: "127.0.0.1:4"}
groups:
  - {id: 7, kind: local-epoch, region: east}
`

func TestParseValid(t *testing.T) {
	top, err := Parse([]byte(twoRegions))
	if err != nil {
		t.Fatal(err)
	}
	if got := top.RTT("west", "east"); got != 60*time.Millisecond {
		t.Errorf("RTT(west, east) = %v, want 60ms", got)
	}
	if got := top.RTT("east", "east"); got != 0 {
		t.Errorf("intra-region RTT = %v, want 0", got)
	}
	if top.LocalEpochInterval != DefaultLocalEpochInterval || top.RaftTick != DefaultRaftTick {
		t.Errorf("defaults not applied: %v %v", top.LocalEpochInterval, top.RaftTick)
	}
	g, ok := top.Group(7)
	if !ok || len(g.Replicas) != 3 || g.Replicas[0] != 1 || g.Replicas[2] != 3 {
		t.Fatalf("group 7 = %+v, want replicas [1 2 3]", g)
	}
	if len(top.GroupsOn(4)) != 0 || len(top.GroupsOn(2)) != 1 {
		t.Errorf("GroupsOn wrong: %v %v", top.GroupsOn(4), top.GroupsOn(2))
	}
	// Round trip through Marshal.
	data, err := top.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(data)
	if err != nil {
		t.Fatalf("re-parse of marshalled topology: %v\n%s", err, data)
	}
	if again.RTT("east", "west") != 60*time.Millisecond || len(again.Nodes) != 4 {
		t.Errorf("round trip lost data: %s", data)
	}
}

func TestExampleOneRegion(t *testing.T) {
	top, err := Load("../../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Nodes) != 3 || len(top.GroupsOfKind(KindLocalEpoch, "us-east1")) != 1 {
		t.Fatalf("unexpected example topology: %+v", top)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown node region", strings.Replace(twoRegions, "{id: 4, region: west", "{id: 4, region: north", 1), `unknown region "north"`},
		{"duplicate node id", strings.Replace(twoRegions, "{id: 4,", "{id: 3,", 1), "duplicate node id 3"},
		{"duplicate address", strings.Replace(twoRegions, `"127.0.0.1:4"`, `"127.0.0.1:3"`, 1), "duplicate address 127.0.0.1:3"},
		{"missing rtt", strings.Replace(twoRegions, "  - {between: [east, west], ms: 60}\n", "", 1), `missing RTT between "east" and "west"`},
		{"rtt unknown region", strings.Replace(twoRegions, "[east, west], ms", "[east, south], ms", 1), `unknown region "south"`},
		{"too few nodes", strings.Replace(twoRegions, "region: east}", "region: west}", 1), `too few nodes in region "west" for 3 replicas (have 1)`},
		{"unknown group region", strings.Replace(twoRegions, "local-epoch, region: east", "local-epoch, region: mars", 1), `unknown region "mars"`},
		{"unknown kind", strings.Replace(twoRegions, "kind: local-epoch", "kind: cache", 1), `unknown kind "cache"`},
		{"replica in other region", strings.Replace(twoRegions, "region: east}", "region: east, replicas: [1, 2, 4]}", 1), "replica node 4 is in"},
		{"unknown replica", strings.Replace(twoRegions, "region: east}", "region: east, replicas: [1, 2, 9]}", 1), "unknown replica node 9"},
		{"bad duration", "local_epoch_interval: soon\n" + twoRegions, `"soon" is not a positive duration`},
		{"quiet epochs 1", "quiet_epochs: 1\n" + twoRegions, "quiet_epochs: 1 would make every epoch quiet"},
		{"lease too short for the WAN", "publisher_lease: 100ms\n" + twoRegions + `  - {id: 8, kind: publisher, region: west, replicas: [4]}
  - {id: 9, kind: global-epoch, region: east}
`, "publisher_lease 100ms must exceed twice the largest round trip"},
		{"unknown field", "colour: red\n" + twoRegions, "colour"},
		{"no regions", "nodes: []", "at least one region"},
		{"bad addr", strings.Replace(twoRegions, `"127.0.0.1:4"`, `"nowhere"`, 1), `addr "nowhere" is not host:port`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestRanges(t *testing.T) {
	base := strings.Replace(twoRegions, "groups:\n", "groups:\n  - {id: 8, kind: directory, region: east}\n  - {id: 20, kind: range, region: east, start: \"\", end: \"m\"}\n  - {id: 21, kind: range, region: east, start: \"m\"}\n", 1)
	top, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]uint64{"": 20, "a": 20, "lzz": 20, "m": 21, "zzz": 21} {
		if g, ok := top.RangeFor([]byte(key)); !ok || g.ID != want {
			t.Errorf("RangeFor(%q) = %d, want %d", key, g.ID, want)
		}
	}
	data, _ := top.Marshal()
	if again, err := Parse(data); err != nil || len(again.Ranges()) != 2 || again.Ranges()[1].End != nil {
		t.Fatalf("ranges lost in a round trip: %v\n%s", err, data)
	}
	for name, c := range map[string]struct{ from, to, want string }{
		"gap":             {`start: "m"}`, `start: "n"}`, "gap or overlap"},
		"no beginning":    {`start: "", end`, `start: "a", end`, "belong to no range"},
		"bounded last":    {`start: "m"}`, `start: "m", end: "z"}`, "last range must have no end"},
		"inverted":        {`start: "", end: "m"`, `start: "", end: ""`, "is not after start"},
		"no start":        {`start: "m"}`, `end: "z"}`, "start is required"},
		"no directory":    {`{id: 8, kind: directory, region: east}`, `{id: 8, kind: txn-state, region: east}`, "has no directory group"},
		"two directories": {`{id: 8, kind: directory, region: east}`, "{id: 8, kind: directory, region: east}\n  - {id: 9, kind: directory, region: east}", "2 directory groups"},
		"id too large":    {`{id: 21,`, `{id: 1000000000,`, "is not below 1000000000"},
	} {
		_, err := Parse([]byte(strings.Replace(base, c.from, c.to, 1)))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error mentioning %q", name, err, c.want)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(t.TempDir() + "/absent.yaml")
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(absent) = %v, want os.ErrNotExist", err)
	}
}

// FuzzParse: any file either parses into a topology that passes its own
// validation again after Marshal, or fails with ErrInvalid; never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte(twoRegions))
	if b, err := os.ReadFile("../../examples/three-regions.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("regions: [a]\nnodes: [{id: 0}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		top, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse error %v is not ErrInvalid", err)
			}
			return
		}
		out, err := top.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(out); err != nil {
			t.Fatalf("a valid topology re-parses as invalid: %v\n%s", err, out)
		}
	})
}

func TestSplitSettings(t *testing.T) {
	base := "regions: [r]\nnodes:\n  - {id: 1, region: r, addr: \"127.0.0.1:1\"}\ngroups:\n  - {id: 1, kind: local-epoch, region: r, replicas: [1]}\n"
	for _, c := range []struct {
		extra string
		size  uint64
		qps   float64
		bad   bool
	}{
		{"", DefaultSplitSize, DefaultSplitQPS, false},
		{"split_size: 512KiB\nsplit_qps: 300\n", 512 << 10, 300, false},
		{"split_size: off\nsplit_qps: off\n", 0, 0, false},
		{"split_size: 1000\n", 1000, DefaultSplitQPS, false},
		{"split_size: 64MB\n", 0, 0, true},
		{"split_size: 0\n", 0, 0, true},
		{"split_qps: -5\n", 0, 0, true},
		{"split_qps: lots\n", 0, 0, true},
	} {
		top, err := Parse([]byte(c.extra + base))
		if c.bad {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%q: %v, want ErrInvalid", c.extra, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.extra, err)
			continue
		}
		if top.SplitSize != c.size || top.SplitQPS != c.qps {
			t.Errorf("%q: size %d qps %v, want %d %v", c.extra, top.SplitSize, top.SplitQPS, c.size, c.qps)
			continue
		}
		// Marshal and Parse round-trip the settings.
		out, err := top.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil || again.SplitSize != c.size || again.SplitQPS != c.qps {
			t.Errorf("%q: round trip gave size %d qps %v (%v)", c.extra, again.SplitSize, again.SplitQPS, err)
		}
	}
}

// TestMergeSettings: the automatic merge thresholds default to a quarter of
// the split thresholds, accept off, and are refused over half of them (the
// hysteresis that keeps a merged range from splitting back).
func TestMergeSettings(t *testing.T) {
	base := "regions: [r]\nnodes:\n  - {id: 1, region: r, addr: \"127.0.0.1:1\"}\ngroups:\n  - {id: 1, kind: local-epoch, region: r, replicas: [1]}\n"
	for _, c := range []struct {
		extra string
		size  uint64
		qps   float64
		delay time.Duration
		bad   bool
	}{
		{"", DefaultSplitSize / 4, DefaultSplitQPS / 4, DefaultMergeDelay, false},
		{"split_size: 8MiB\nsplit_qps: 400\n", 2 << 20, 100, DefaultMergeDelay, false},
		{"merge_size: 1MiB\nmerge_qps: 50\nmerge_delay: 5s\n", 1 << 20, 50, 5 * time.Second, false},
		{"split_size: off\nsplit_qps: off\n", DefaultSplitSize / 4, DefaultSplitQPS / 4, DefaultMergeDelay, false},
		{"merge_size: off\n", 0, DefaultSplitQPS / 4, DefaultMergeDelay, false},
		{"split_qps: off\nmerge_qps: off\n", DefaultSplitSize / 4, 0, DefaultMergeDelay, false},
		{"merge_size: 300MiB\n", 0, 0, 0, true}, // over half of 512 MiB
		{"merge_qps: 2000\n", 0, 0, 0, true},    // over half of 2500
		{"merge_qps: off\n", 0, 0, 0, true},     // hot ranges would merge back
		{"merge_qps: -1\n", 0, 0, 0, true},
		{"merge_delay: 0s\n", 0, 0, 0, true},
		{"merge_size: lots\n", 0, 0, 0, true},
	} {
		top, err := Parse([]byte(c.extra + base))
		if c.bad {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%q: %v, want ErrInvalid", c.extra, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.extra, err)
			continue
		}
		if top.MergeSize != c.size || top.MergeQPS != c.qps || top.MergeDelay != c.delay {
			t.Errorf("%q: merge size %d qps %v delay %v, want %d %v %v", c.extra, top.MergeSize, top.MergeQPS, top.MergeDelay, c.size, c.qps, c.delay)
			continue
		}
		out, err := top.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil || again.MergeSize != c.size || again.MergeQPS != c.qps || again.MergeDelay != c.delay {
			t.Errorf("%q: round trip gave merge size %d qps %v delay %v (%v)", c.extra, again.MergeSize, again.MergeQPS, again.MergeDelay, err)
		}
	}
}

// durationCase is one case of a duration setting: extra lines for the file,
// and the value wanted, or the text of the ErrInvalid wanted.
type durationCase struct {
	extra string
	want  time.Duration
	bad   string
}

// checkDurationSetting parses a one-node file with each case's extra lines
// and checks the setting get reads, the refusal, and a Marshal round trip.
func checkDurationSetting(t *testing.T, get func(*Topology) time.Duration, cases []durationCase) {
	t.Helper()
	base := "regions: [r]\nnodes:\n  - {id: 1, region: r, addr: \"127.0.0.1:1\"}\ngroups:\n  - {id: 1, kind: local-epoch, region: r, replicas: [1]}\n"
	for _, c := range cases {
		top, err := Parse([]byte(c.extra + base))
		if c.bad != "" {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("%q: %v, want ErrInvalid saying %q", c.extra, err, c.bad)
			}
			continue
		}
		if err != nil || get(top) != c.want {
			t.Errorf("%q: %v, %v; want %v", c.extra, top, err, c.want)
			continue
		}
		out, _ := top.Marshal()
		if again, err := Parse(out); err != nil || get(again) != c.want {
			t.Errorf("%q: round trip gave %v (%v)", c.extra, again, err)
		}
	}
}

func TestGCTTLSetting(t *testing.T) {
	checkDurationSetting(t, func(top *Topology) time.Duration { return top.GCTTL }, []durationCase{
		{"", DefaultGCTTL, ""},
		{"gc_ttl: 1m\n", time.Minute, ""},
		{"gc_ttl: 1s\n", time.Second, ""},
		{"gc_ttl: 500ms\n", 0, "below 1s"},
		{"closed_epoch_interval: 5ms\n", 0, "below 10ms"},
		{"closed_epoch_interval: soon\n", 0, "not a positive duration"},
		{"gc_ttl: 0s\n", 0, "not a positive duration"},
		{"gc_ttl: forever\n", 0, "not a positive duration"},
	})
}

// TestLocalEpochIdleSetting: the idle pace defaults to 100 ms (never
// below the full pace), "off" keeps the full pace, a bad value or one above
// 1 s is refused, and the setting survives Marshal.
func TestLocalEpochIdleSetting(t *testing.T) {
	checkDurationSetting(t, func(top *Topology) time.Duration { return top.LocalEpochIdleInterval }, []durationCase{
		{"", DefaultLocalEpochIdleInterval, ""},
		{"local_epoch_interval: 200ms\n", 200 * time.Millisecond, ""},
		{"local_epoch_idle_interval: 250ms\n", 250 * time.Millisecond, ""},
		{"local_epoch_idle_interval: off\n", DefaultLocalEpochInterval, ""},
		{"local_epoch_idle_interval: 0s\n", 0, "not a positive duration"},
		{"local_epoch_idle_interval: slow\n", 0, "not a positive duration"},
		{"local_epoch_idle_interval: 2s\n", 0, "above 1s"},
	})
}

// TestGlobalEpochIdleSetting: the global epoch's idle pace defaults to
// 100 ms, or a quarter of a short publisher_lease; off is 0; more than a
// quarter of the lease is refused; the setting survives Marshal.
func TestGlobalEpochIdleSetting(t *testing.T) {
	checkDurationSetting(t, func(top *Topology) time.Duration { return top.GlobalEpochIdleInterval }, []durationCase{
		{"", DefaultGlobalEpochIdleInterval, ""},
		{"publisher_lease: 200ms\n", 50 * time.Millisecond, ""},
		{"global_epoch_idle_interval: 250ms\n", 250 * time.Millisecond, ""},
		{"global_epoch_idle_interval: off\n", 0, ""},
		{"global_epoch_idle_interval: 300ms\n", 0, "above a quarter of publisher_lease"},
		{"global_epoch_idle_interval: soon\n", 0, "not a positive duration"},
	})
}

func TestRangeLeaseSettings(t *testing.T) {
	base := "regions: [r]\nnodes:\n  - {id: 1, region: r, addr: \"127.0.0.1:1\"}\ngroups:\n  - {id: 1, kind: local-epoch, region: r, replicas: [1]}\n"
	for _, c := range []struct {
		extra        string
		lease, renew uint64
		bad          string
	}{
		{"", 100, 50, ""},
		{"range_lease_epochs: 40\n", 40, 20, ""},
		{"range_lease_epochs: 40\nrange_lease_renew_epochs: 30\n", 40, 30, ""},
		{"range_lease_epochs: 5\n", 0, 0, "below 10"},
		{"range_lease_epochs: 40\nrange_lease_renew_epochs: 39\n", 0, 0, "between 2 and range_lease_epochs - 2 (38)"},
		{"range_lease_renew_epochs: 1\n", 0, 0, "between 2"},
		{"range_lease_epochs: -3\n", 0, 0, "line 1"},
	} {
		top, err := Parse([]byte(c.extra + base))
		if c.bad != "" {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("%q: %v, want ErrInvalid saying %q", c.extra, err, c.bad)
			}
			continue
		}
		if err != nil || top.RangeLeaseEpochs != c.lease || top.RangeLeaseRenewEpochs != c.renew {
			t.Errorf("%q: %v; got lease %d renew %d, want %d %d", c.extra, err, top.RangeLeaseEpochs, top.RangeLeaseRenewEpochs, c.lease, c.renew)
			continue
		}
		out, _ := top.Marshal()
		if again, err := Parse(out); err != nil || again.RangeLeaseEpochs != c.lease || again.RangeLeaseRenewEpochs != c.renew {
			t.Errorf("%q: round trip gave %v (%v)", c.extra, again, err)
		}
	}
}

func TestWithNode(t *testing.T) {
	top, err := Parse([]byte("regions: [r, s]\nrtt: [{between: [r, s], ms: 5}]\nnodes:\n  - {id: 1, region: r, addr: \"127.0.0.1:1\"}\ngroups:\n  - {id: 1, kind: local-epoch, region: r, replicas: [1]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	more, err := top.WithNode(Node{ID: 7, Region: "s", Addr: "127.0.0.1:7"})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := more.Node(7); !ok || n.Region != "s" || len(more.GroupsOn(7)) != 0 {
		t.Fatalf("added node: %v %v", n, ok)
	}
	if _, ok := top.Node(7); ok {
		t.Fatal("WithNode changed the original topology")
	}
	for _, c := range []struct {
		n   Node
		bad string
	}{
		{Node{ID: 0, Region: "r", Addr: "127.0.0.1:9"}, "id 0"},
		{Node{ID: 1, Region: "r", Addr: "127.0.0.1:9"}, "already in use"},
		{Node{ID: 9, Region: "mars", Addr: "127.0.0.1:9"}, `unknown region "mars"`},
		{Node{ID: 9, Region: "r", Addr: "127.0.0.1:1"}, "duplicate address"},
		{Node{ID: 9, Region: "r", Addr: "nowhere"}, "not host:port"},
	} {
		if _, err := top.WithNode(c.n); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.bad) {
			t.Errorf("WithNode(%+v) = %v, want ErrInvalid saying %q", c.n, err, c.bad)
		}
	}
}
