// Package topology parses and validates the cluster topology file: the regions,
// the nodes of each region, the replicated groups (Raft groups) the cluster runs,
// and the round-trip-time matrix between regions (DESIGN.md §2, §8).
//
// The file is YAML:
//
//	local_epoch_interval: 10ms
//	raft_tick: 10ms
//	regions: [us-east1, us-west1]
//	rtt:
//	  - {between: [us-east1, us-west1], ms: 63}
//	nodes:
//	  - {id: 1, region: us-east1, addr: 127.0.0.1:7101}
//	groups:
//	  - {id: 1, kind: local-epoch, region: us-east1, replicas: [1, 2, 3]}
//
// A topology is immutable once loaded; every component reads it, none changes it.
package topology

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Kind names what a replicated group holds (DESIGN.md §2).
type Kind string

const (
	// KindLocalEpoch is a region's local epoch service (DESIGN.md §2, §3.1).
	KindLocalEpoch Kind = "local-epoch"
	// KindTxnState is a region's transaction state store (DESIGN.md §2, §4.4).
	KindTxnState Kind = "txn-state"
	// KindRange is one range of the key space: its MVCC data, lease and locks (DESIGN.md §2).
	KindRange Kind = "range"
	// KindPublisher is a region's epoch publisher: the global epoch as last
	// pushed to the region (DESIGN.md §2, §7).
	KindPublisher Kind = "publisher"
	// KindGlobalEpoch is the global epoch service (DESIGN.md §2, §7). Its
	// replicas may be placed in any regions.
	KindGlobalEpoch Kind = "global-epoch"
	// KindDirectory is a region's range directory: the descriptors of the
	// ranges homed there, its range-ID allocator and the placement map
	// (DESIGN.md §11). Every region that homes ranges has exactly one.
	KindDirectory Kind = "directory"
)

// MaxGroupID bounds the IDs of the file's groups: IDs from MaxGroupID on are
// the range directories' to allocate to ranges that splits create.
const MaxGroupID = 1_000_000_000

// knownKinds lists the kinds this version can host.
var knownKinds = map[Kind]bool{KindLocalEpoch: true, KindTxnState: true, KindRange: true, KindPublisher: true, KindGlobalEpoch: true, KindDirectory: true}

// Defaults applied when the file leaves a field out.
const (
	// DefaultLocalEpochInterval is how often a local epoch leader advances the epoch (paper §6.1).
	DefaultLocalEpochInterval = 10 * time.Millisecond
	// DefaultLocalEpochIdleInterval is how often a local epoch leader advances
	// the epoch while no reader asks for the full pace (epoch.Pace; issue 17).
	DefaultLocalEpochIdleInterval = 100 * time.Millisecond
	// DefaultGlobalEpochIdleInterval is the least time between global epoch
	// advances while no reader asks for the global epoch (epoch.Demand).
	DefaultGlobalEpochIdleInterval = 100 * time.Millisecond
	// DefaultRaftTick is the unit of Raft's timeouts: elections after 30–55
	// of it, heartbeats every 10; a group's Raft clock ticks every 5 (raftgroup).
	DefaultRaftTick = 10 * time.Millisecond
	// DefaultReplicas is the replication factor of a group that names no replicas.
	DefaultReplicas = 3
	// DefaultPublisherLease is how long a publisher serves the global epoch
	// after its last update (DESIGN.md §7).
	DefaultPublisherLease = time.Second
	// DefaultSplitSize is the data size, in bytes on disk, past which a range
	// splits by itself (DESIGN.md §11): 512 MiB, CockroachDB's default. Each
	// range is a Raft group with its own appends and Ready loop, so a
	// smaller default multiplies what a node pays per operation as the MVCC
	// history grows (64 MiB ranges took a YCSB-A cluster from 4 ranges to
	// 16 in 10 minutes and its throughput to two thirds); a snapshot of
	// any size streams in chunks (raftgroup.Streamed).
	DefaultSplitSize = 512 << 20
	// DefaultSplitQPS is the request rate, per second at a range's leader,
	// past which a range splits by load (DESIGN.md §11).
	DefaultSplitQPS = 2500
	// DefaultOrphanAfter is how long a range leader waits for a heartbeat from
	// a transaction's coordinator before treating it as an orphan (DESIGN.md §10).
	DefaultOrphanAfter = 2 * time.Second
	// DefaultGCTTL is how long old versions stay readable (DESIGN.md §14).
	DefaultGCTTL = 4 * time.Hour
	// MinGCTTL is the least gc_ttl a file may set: a shorter one would fail
	// snapshots while they run.
	MinGCTTL = time.Second
	// DefaultTxnRecordGrace is how long a transaction record nobody forgot
	// stays before the txn-state leader settles and forgets it (DESIGN.md §14).
	DefaultTxnRecordGrace = time.Minute
	// DefaultClosedEpochInterval is how often a range leader closes an
	// epoch (DESIGN.md §13).
	DefaultClosedEpochInterval = 30 * time.Millisecond
	// MinClosedEpochInterval is the shortest closed_epoch_interval accepted.
	MinClosedEpochInterval = 10 * time.Millisecond
	// DefaultRangeLeaseEpochs is how far, in local epochs, a range lease
	// reaches past the epoch it was granted or renewed at (paper §2.3.1:
	// 100, one second at 10 ms epochs): the longest a frozen leaseholder
	// keeps its range from being served elsewhere.
	DefaultRangeLeaseEpochs = 100
	// DefaultLivenessTimeout is how long a node may go unheard before its
	// region counts it as not live (DESIGN.md §12).
	DefaultLivenessTimeout = 5 * time.Second
	// DefaultReplaceAfter is how long a node may be down before its
	// replicas are rebuilt elsewhere (DESIGN.md §12).
	DefaultReplaceAfter = 5 * time.Minute
	// DefaultRebalanceInterval is how often a region's replicate queue
	// plans.
	DefaultRebalanceInterval = 2 * time.Second
	// DefaultMaxSnapshots is how many replica moves a region's replicate
	// queue runs at once.
	DefaultMaxSnapshots = 2
	// MinLivenessTimeout is the shortest liveness_timeout accepted.
	MinLivenessTimeout = 500 * time.Millisecond
	// DefaultMergeDelay is how long two neighbouring ranges must keep their
	// shape before they merge automatically (DESIGN.md §11).
	DefaultMergeDelay = 30 * time.Second
)

// ErrInvalid marks every validation failure; the wrapped message names the field.
var ErrInvalid = errors.New("invalid topology")

// Topology is a validated cluster description. Use Load or Parse to obtain one.
type Topology struct {
	// LocalEpochInterval is the period between local epoch advances.
	LocalEpochInterval time.Duration
	// LocalEpochIdleInterval is the period between local epoch advances in a
	// region whose epoch no reader asked to move for a second (epoch.Pace);
	// at most LocalEpochInterval keeps the full pace always ("off").
	LocalEpochIdleInterval time.Duration
	// RaftTick is the unit of Raft's timeouts (raftgroup.Config.Tick).
	RaftTick time.Duration
	// PublisherLease is how long a publisher serves after its last update.
	PublisherLease time.Duration
	// GlobalEpochMinInterval is the least time between global epoch advances
	// (0: as fast as every publisher acknowledges).
	GlobalEpochMinInterval time.Duration
	// GlobalEpochIdleInterval is the least time between global epoch
	// advances while no reader asked for the global epoch for a second
	// (epoch.Demand; 0: off). It is at most a quarter of PublisherLease.
	GlobalEpochIdleInterval time.Duration
	// QuietEpochs is k of the paper's §5.3.1: no transaction commits at a
	// global epoch that is a multiple of k, which bounds linearizable snapshot
	// retries (0: off).
	QuietEpochs uint64
	// AutoExcludeAfter is how long the global epoch service waits on a
	// publisher that does not acknowledge before excluding its region on its
	// own (DESIGN.md §7; 0: never, an operator decides).
	AutoExcludeAfter time.Duration
	// OrphanAfter is how long a range leader lets a transaction hold locks
	// without hearing from its coordinator (an operation or a heartbeat)
	// before resolving it through the transaction state store (DESIGN.md
	// §10). Coordinators heartbeat every OrphanAfter/4. Waiting for a lock
	// never counts as silence.
	OrphanAfter time.Duration
	// SplitSize is the data size in bytes past which a range splits at its
	// middle (0: never by size). File: split_size, e.g. 64MiB or off.
	SplitSize uint64
	// SplitQPS is the request rate per second past which a range splits at
	// the key that divides its load (0: never by load). File: split_qps, a
	// number or off.
	SplitQPS float64
	// MergeSize: two neighbouring ranges of one region and the same nodes
	// merge automatically once together they take fewer bytes on disk than
	// this (0: never automatically). File: merge_size, default a quarter of
	// split_size (of the default if that is off); under half of split_size, so a
	// merged range does not split back.
	MergeSize uint64
	// MergeQPS: ... and together serve fewer requests per second than this
	// (0: load is not considered). File: merge_qps, default a quarter of
	// split_qps; under half of it.
	MergeQPS float64
	// MergeDelay: ... and neither has split or merged for this long. File:
	// merge_delay, default 30s.
	MergeDelay time.Duration
	// AutoRehomeAfter: once at least AutoRehomeShare of a range's write
	// transactions, and at least AutoRehomeMinRate per second, have come
	// from one other region for this long, the replicate queue rehomes the
	// range there (DESIGN.md §13); a range under a placement rule stays
	// where the rule homes it. File: auto_rehome_after, default off (0).
	AutoRehomeAfter time.Duration
	// GCTTL is how long a version stays readable once a newer one
	// replaced it: ranges collect versions older than the epoch that was
	// current GCTTL ago (DESIGN.md §14). File: gc_ttl, default 4h, at
	// least 1s.
	GCTTL time.Duration
	// TxnRecordGrace is how long a transaction record that its coordinator
	// did not forget stays, on the txn-state leader's clock, before the
	// leader settles it with its participants and forgets it (DESIGN.md
	// §14). File: txn_record_grace, default 1m, at least orphan_after.
	TxnRecordGrace time.Duration
	// ClosedEpochInterval is the least time between two epochs a range
	// leader closes (DESIGN.md §13): each close is one Raft entry of the
	// range, and a changefeed's resolved epoch trails the publisher by
	// about this much. File: closed_epoch_interval, default 200ms, at
	// least 10ms.
	ClosedEpochInterval time.Duration
	// RangeLeaseEpochs is how far, in local epochs, a range lease reaches
	// past the epoch it is granted or renewed at (DESIGN.md §3.3): a
	// frozen or partitioned leaseholder keeps its ranges unserved for up
	// to this long. File: range_lease_epochs, default 100, at least 10.
	RangeLeaseEpochs uint64
	// RangeLeaseRenewEpochs: a leaseholder renews its lease once fewer
	// than this many epochs of it remain, and a new leader queues its
	// lease behind one ending this close (each renewal is one Raft entry
	// of the range). File: range_lease_renew_epochs, default half of
	// range_lease_epochs, between 2 and range_lease_epochs - 2.
	RangeLeaseRenewEpochs uint64
	// LivenessTimeout is how long a region's directory leader goes
	// without a node's heartbeat before it counts the node as not live
	// (DESIGN.md §12); nodes heartbeat four times as often. File:
	// liveness_timeout, default 5s, at least 500ms.
	LivenessTimeout time.Duration
	// ReplaceAfter: a node its region has not heard from for this long has
	// its replicas rebuilt on the region's other live nodes (DESIGN.md
	// §12). File: replace_after, default 5m, "off" for never, at least
	// liveness_timeout.
	ReplaceAfter time.Duration
	// RebalanceInterval is how often a region's replicate queue plans
	// (DESIGN.md §12); 0 turns it off (operators who place replicas by
	// hand, benchmarks that move one replica). File: rebalance_interval,
	// default 2s, or off.
	RebalanceInterval time.Duration
	// MaxSnapshots bounds a region's replicate queue: at most this many
	// replica moves (each streams one snapshot) at once. File:
	// rebalance_snapshots, default 2.
	MaxSnapshots int
	// Regions lists region names in file order.
	Regions []string
	// Nodes lists every node in file order.
	Nodes []Node
	// Groups lists every replicated group in file order.
	Groups []Group

	nodeByID map[uint64]int
	rtt      map[[2]string]time.Duration
}

// Node is one node process.
type Node struct {
	// ID is the node's unique, non-zero identifier; it is also its Raft replica ID in every group.
	ID uint64
	// Region is the region the node runs in.
	Region string
	// Addr is the host:port the node's gRPC server listens on.
	Addr string
}

// Group is one Raft group.
type Group struct {
	// ID is the group's unique, non-zero identifier.
	ID uint64
	// Kind is what the group holds.
	Kind Kind
	// Region is the region the group serves.
	Region string
	// Replicas are the node IDs that host a replica, sorted ascending.
	Replicas []uint64
	// Start and End bound a range's keys, [Start, End); a nil End is unbounded.
	// Both are nil for other kinds.
	Start, End []byte
}

// Contains reports whether key belongs to range g.
func (g Group) Contains(key []byte) bool {
	return bytes.Compare(g.Start, key) <= 0 && (g.End == nil || bytes.Compare(key, g.End) < 0)
}

type fileTopology struct {
	LocalEpochInterval string      `yaml:"local_epoch_interval"`
	LocalEpochIdle     string      `yaml:"local_epoch_idle_interval,omitempty"`
	PublisherLease     string      `yaml:"publisher_lease"`
	GlobalMinInterval  string      `yaml:"global_epoch_min_interval"`
	GlobalIdle         string      `yaml:"global_epoch_idle_interval,omitempty"`
	QuietEpochs        uint64      `yaml:"quiet_epochs"`
	AutoExcludeAfter   string      `yaml:"auto_exclude_after"`
	OrphanAfter        string      `yaml:"orphan_after,omitempty"`
	SplitSize          string      `yaml:"split_size,omitempty"`
	SplitQPS           string      `yaml:"split_qps,omitempty"`
	MergeSize          string      `yaml:"merge_size,omitempty"`
	MergeQPS           string      `yaml:"merge_qps,omitempty"`
	MergeDelay         string      `yaml:"merge_delay,omitempty"`
	AutoRehomeAfter    string      `yaml:"auto_rehome_after,omitempty"`
	GCTTL              string      `yaml:"gc_ttl,omitempty"`
	TxnRecordGrace     string      `yaml:"txn_record_grace,omitempty"`
	ClosedInterval     string      `yaml:"closed_epoch_interval,omitempty"`
	RangeLeaseEpochs   uint64      `yaml:"range_lease_epochs,omitempty"`
	RangeLeaseRenew    uint64      `yaml:"range_lease_renew_epochs,omitempty"`
	LivenessTimeout    string      `yaml:"liveness_timeout,omitempty"`
	ReplaceAfter       string      `yaml:"replace_after,omitempty"`
	MaxSnapshots       int         `yaml:"rebalance_snapshots,omitempty"`
	RebalanceInterval  string      `yaml:"rebalance_interval,omitempty"`
	RaftTick           string      `yaml:"raft_tick"`
	Regions            []string    `yaml:"regions"`
	RTT                []fileRTT   `yaml:"rtt"`
	Nodes              []fileNode  `yaml:"nodes"`
	Groups             []fileGroup `yaml:"groups"`
}

type fileRTT struct {
	Between []string `yaml:"between"`
	MS      float64  `yaml:"ms"`
}

type fileNode struct {
	ID     uint64 `yaml:"id"`
	Region string `yaml:"region"`
	Addr   string `yaml:"addr"`
}

type fileGroup struct {
	ID          uint64   `yaml:"id"`
	Kind        string   `yaml:"kind"`
	Region      string   `yaml:"region"`
	Replicas    []uint64 `yaml:"replicas"`
	Replication int      `yaml:"replication"`
	Start       *string  `yaml:"start"`
	End         *string  `yaml:"end"`
}

// Load reads and validates the topology file at path.
// Errors wrap ErrInvalid for content problems, or the os error for I/O.
func Load(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse validates a topology from YAML bytes. Unknown fields are rejected.
// Errors wrap ErrInvalid and name the offending entry.
func Parse(data []byte) (*Topology, error) {
	var f fileTopology
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, describeDecode(err)
	}
	return build(&f)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func parseDuration(field, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, invalid("%s: %q is not a positive duration (e.g. 10ms)", field, s)
	}
	return d, nil
}

// parseSize reads a byte count such as 512KiB, 64MiB or 1GiB (or a plain
// number of bytes); "off" is 0.
// parseRate parses a request rate per second, or off (0); "" gives def.
func parseRate(field, s string, def float64) (float64, error) {
	switch s {
	case "":
		return def, nil
	case "off":
		return 0, nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || r <= 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		return 0, invalid("%s: %q is not a positive number of requests per second (or off)", field, s)
	}
	return r, nil
}

// parseMerges sets the automatic merge thresholds (after the split ones)
// and checks that they sit under half of the split thresholds: the
// hysteresis that keeps a range from splitting and merging back and forth.
func (t *Topology) parseMerges(f *fileTopology) (err error) {
	defSize := uint64(DefaultSplitSize / 4)
	if t.SplitSize > 0 {
		defSize = t.SplitSize / 4
	}
	if t.MergeSize, err = parseSize("merge_size", f.MergeSize, defSize); err != nil {
		return err
	}
	if t.SplitSize > 0 && t.MergeSize*2 > t.SplitSize {
		return invalid("merge_size: %d bytes is over half of split_size (%d bytes): merged ranges would split back", t.MergeSize, t.SplitSize)
	}
	defQPS := float64(DefaultSplitQPS) / 4
	if t.SplitQPS > 0 {
		defQPS = t.SplitQPS / 4
	}
	if t.MergeQPS, err = parseRate("merge_qps", f.MergeQPS, defQPS); err != nil {
		return err
	}
	if t.SplitQPS > 0 && (t.MergeQPS == 0 || t.MergeQPS*2 > t.SplitQPS) {
		return invalid("merge_qps: %v requests/s is over half of split_qps (%v): merged ranges would split back", t.MergeQPS, t.SplitQPS)
	}
	t.MergeDelay, err = parseDuration("merge_delay", f.MergeDelay, DefaultMergeDelay)
	return err
}

// ParseSize reads a size as the file writes them: bytes with an optional
// B, KiB, MiB or GiB suffix (64MiB). Errors wrap ErrInvalid for anything
// else, or 0.
func ParseSize(s string) (uint64, error) {
	if s == "" || s == "off" {
		return 0, invalid("size: %q is not a size such as 64MiB", s)
	}
	return parseSize("size", s, 0)
}

func parseSize(field, s string, def uint64) (uint64, error) {
	switch s {
	case "":
		return def, nil
	case "off":
		return 0, nil
	}
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, invalid("%s: %q is not a size such as 64MiB (or off)", field, s)
	}
	return n * mult, nil
}

func build(f *fileTopology) (*Topology, error) {
	t := &Topology{nodeByID: map[uint64]int{}, rtt: map[[2]string]time.Duration{}}
	var err error
	if t.LocalEpochInterval, err = parseDuration("local_epoch_interval", f.LocalEpochInterval, DefaultLocalEpochInterval); err != nil {
		return nil, err
	}
	if f.LocalEpochIdle == "off" {
		t.LocalEpochIdleInterval = t.LocalEpochInterval
	} else if t.LocalEpochIdleInterval, err = parseDuration("local_epoch_idle_interval", f.LocalEpochIdle, max(DefaultLocalEpochIdleInterval, t.LocalEpochInterval)); err != nil {
		return nil, err
	} else if t.LocalEpochIdleInterval > time.Second {
		return nil, invalid("local_epoch_idle_interval: %v is above 1s: an idle region's leases and closed epochs would crawl", t.LocalEpochIdleInterval)
	}
	if t.RaftTick, err = parseDuration("raft_tick", f.RaftTick, DefaultRaftTick); err != nil {
		return nil, err
	}
	if t.PublisherLease, err = parseDuration("publisher_lease", f.PublisherLease, DefaultPublisherLease); err != nil {
		return nil, err
	}
	switch f.GlobalIdle {
	case "off":
	case "":
		t.GlobalEpochIdleInterval = min(DefaultGlobalEpochIdleInterval, t.PublisherLease/4)
	default:
		if t.GlobalEpochIdleInterval, err = parseDuration("global_epoch_idle_interval", f.GlobalIdle, 0); err != nil {
			return nil, err
		}
		if t.GlobalEpochIdleInterval > t.PublisherLease/4 {
			return nil, invalid("global_epoch_idle_interval: %v is above a quarter of publisher_lease (%v): publishers would lapse", t.GlobalEpochIdleInterval, t.PublisherLease)
		}
	}
	if f.GlobalMinInterval != "" {
		if t.GlobalEpochMinInterval, err = parseDuration("global_epoch_min_interval", f.GlobalMinInterval, 0); err != nil {
			return nil, err
		}
	}
	if t.QuietEpochs = f.QuietEpochs; t.QuietEpochs == 1 {
		return nil, invalid("quiet_epochs: 1 would make every epoch quiet; use 0 (off) or at least 2")
	}
	if f.AutoRehomeAfter != "" && f.AutoRehomeAfter != "off" {
		if t.AutoRehomeAfter, err = parseDuration("auto_rehome_after", f.AutoRehomeAfter, 0); err != nil {
			return nil, err
		}
	}
	if f.AutoExcludeAfter != "" {
		if t.AutoExcludeAfter, err = parseDuration("auto_exclude_after", f.AutoExcludeAfter, 0); err != nil {
			return nil, err
		}
	}
	if t.OrphanAfter, err = parseDuration("orphan_after", f.OrphanAfter, DefaultOrphanAfter); err != nil {
		return nil, err
	}
	if t.SplitSize, err = parseSize("split_size", f.SplitSize, DefaultSplitSize); err != nil {
		return nil, err
	}
	if t.SplitQPS, err = parseRate("split_qps", f.SplitQPS, DefaultSplitQPS); err != nil {
		return nil, err
	}
	if err := t.parseMerges(f); err != nil {
		return nil, err
	}
	if t.GCTTL, err = parseDuration("gc_ttl", f.GCTTL, DefaultGCTTL); err != nil {
		return nil, err
	}
	if t.GCTTL < MinGCTTL {
		return nil, invalid("gc_ttl: %v is below %v: snapshots would fail while they run", t.GCTTL, MinGCTTL)
	}
	if t.TxnRecordGrace, err = parseDuration("txn_record_grace", f.TxnRecordGrace, DefaultTxnRecordGrace); err != nil {
		return nil, err
	}
	if t.TxnRecordGrace < t.OrphanAfter {
		return nil, invalid("txn_record_grace: %v is below orphan_after (%v): records would go before participants resolve their orphans", t.TxnRecordGrace, t.OrphanAfter)
	}
	if t.ClosedEpochInterval, err = parseDuration("closed_epoch_interval", f.ClosedInterval, DefaultClosedEpochInterval); err != nil {
		return nil, err
	}
	if t.ClosedEpochInterval < MinClosedEpochInterval {
		return nil, invalid("closed_epoch_interval: %v is below %v: every range would write a Raft entry that often", t.ClosedEpochInterval, MinClosedEpochInterval)
	}
	if t.RangeLeaseEpochs = cmp.Or(f.RangeLeaseEpochs, DefaultRangeLeaseEpochs); t.RangeLeaseEpochs < 10 {
		return nil, invalid("range_lease_epochs: %d is below 10: leases would be renewed almost every epoch", t.RangeLeaseEpochs)
	}
	if t.RangeLeaseRenewEpochs = cmp.Or(f.RangeLeaseRenew, t.RangeLeaseEpochs/2); t.RangeLeaseRenewEpochs < 2 || t.RangeLeaseRenewEpochs > t.RangeLeaseEpochs-2 {
		return nil, invalid("range_lease_renew_epochs: %d must be between 2 and range_lease_epochs - 2 (%d)", t.RangeLeaseRenewEpochs, t.RangeLeaseEpochs-2)
	}
	if t.LivenessTimeout, err = parseDuration("liveness_timeout", f.LivenessTimeout, DefaultLivenessTimeout); err != nil {
		return nil, err
	}
	if t.LivenessTimeout < MinLivenessTimeout {
		return nil, invalid("liveness_timeout: %v is below %v: a busy node would be counted dead", t.LivenessTimeout, MinLivenessTimeout)
	}
	if f.ReplaceAfter != "off" {
		if t.ReplaceAfter, err = parseDuration("replace_after", f.ReplaceAfter, DefaultReplaceAfter); err != nil {
			return nil, err
		}
		if t.ReplaceAfter < t.LivenessTimeout {
			return nil, invalid("replace_after: %v is below liveness_timeout (%v); say off for never", t.ReplaceAfter, t.LivenessTimeout)
		}
	}
	if f.RebalanceInterval != "off" {
		if t.RebalanceInterval, err = parseDuration("rebalance_interval", f.RebalanceInterval, DefaultRebalanceInterval); err != nil {
			return nil, err
		}
		if t.RebalanceInterval < 100*time.Millisecond {
			return nil, invalid("rebalance_interval: %v is below 100ms; say off to turn the replicate queue off", t.RebalanceInterval)
		}
	}
	if t.MaxSnapshots = cmp.Or(f.MaxSnapshots, DefaultMaxSnapshots); t.MaxSnapshots < 1 {
		return nil, invalid("rebalance_snapshots: %d is below 1", t.MaxSnapshots)
	}
	if len(f.Regions) == 0 {
		return nil, invalid("regions: at least one region is required")
	}
	regions := map[string]bool{}
	for _, r := range f.Regions {
		if r == "" {
			return nil, invalid("regions: empty region name")
		}
		if regions[r] {
			return nil, invalid("regions: duplicate region %q", r)
		}
		regions[r] = true
	}
	t.Regions = append([]string(nil), f.Regions...)

	for i, r := range f.RTT {
		if len(r.Between) != 2 {
			return nil, invalid("rtt[%d]: between must name exactly two regions", i)
		}
		a, b := r.Between[0], r.Between[1]
		for _, x := range r.Between {
			if !regions[x] {
				return nil, invalid("rtt[%d]: unknown region %q", i, x)
			}
		}
		if a == b {
			return nil, invalid("rtt[%d]: a region's RTT to itself is not configurable (%q)", i, a)
		}
		if r.MS < 0 {
			return nil, invalid("rtt[%d]: negative RTT %v ms", i, r.MS)
		}
		k := pairKey(a, b)
		if _, dup := t.rtt[k]; dup {
			return nil, invalid("rtt[%d]: duplicate RTT for %s–%s", i, a, b)
		}
		t.rtt[k] = time.Duration(r.MS * float64(time.Millisecond))
	}
	for i, a := range t.Regions {
		for _, b := range t.Regions[i+1:] {
			if _, ok := t.rtt[pairKey(a, b)]; !ok {
				return nil, invalid("rtt: missing RTT between %q and %q", a, b)
			}
		}
	}

	addrs := map[string]uint64{}
	for i, n := range f.Nodes {
		if n.ID == 0 {
			return nil, invalid("nodes[%d]: id must be a positive integer", i)
		}
		if _, dup := t.nodeByID[n.ID]; dup {
			return nil, invalid("nodes[%d]: duplicate node id %d", i, n.ID)
		}
		if !regions[n.Region] {
			return nil, invalid("node %d: unknown region %q", n.ID, n.Region)
		}
		if _, _, err := net.SplitHostPort(n.Addr); err != nil {
			return nil, invalid("node %d: addr %q is not host:port", n.ID, n.Addr)
		}
		if other, dup := addrs[n.Addr]; dup {
			return nil, invalid("node %d: duplicate address %s (also node %d)", n.ID, n.Addr, other)
		}
		addrs[n.Addr] = n.ID
		t.nodeByID[n.ID] = len(t.Nodes)
		t.Nodes = append(t.Nodes, Node{ID: n.ID, Region: n.Region, Addr: n.Addr})
	}
	if len(t.Nodes) == 0 {
		return nil, invalid("nodes: at least one node is required")
	}

	groupIDs := map[uint64]bool{}
	for i, g := range f.Groups {
		if g.ID == 0 {
			return nil, invalid("groups[%d]: id must be a positive integer", i)
		}
		if g.ID >= MaxGroupID {
			return nil, invalid("groups[%d]: id %d is not below %d (range directories allocate IDs from there)", i, g.ID, uint64(MaxGroupID))
		}
		if groupIDs[g.ID] {
			return nil, invalid("groups[%d]: duplicate group id %d", i, g.ID)
		}
		groupIDs[g.ID] = true
		kind := Kind(g.Kind)
		if !knownKinds[kind] {
			return nil, invalid("group %d: unknown kind %q", g.ID, g.Kind)
		}
		if !regions[g.Region] {
			return nil, invalid("group %d: unknown region %q", g.ID, g.Region)
		}
		replicas, err := t.placeReplicas(g)
		if err != nil {
			return nil, err
		}
		grp := Group{ID: g.ID, Kind: kind, Region: g.Region, Replicas: replicas}
		if kind == KindRange {
			if g.Start == nil {
				return nil, invalid("range %d: start is required (\"\" for the beginning of the key space)", g.ID)
			}
			grp.Start = []byte(*g.Start)
			if g.End != nil {
				grp.End = []byte(*g.End)
				if bytes.Compare(grp.Start, grp.End) >= 0 {
					return nil, invalid("range %d: end %q is not after start %q", g.ID, *g.End, *g.Start)
				}
			}
		} else if g.Start != nil || g.End != nil {
			return nil, invalid("group %d: only ranges have start and end", g.ID)
		}
		t.Groups = append(t.Groups, grp)
	}
	if err := t.checkRanges(); err != nil {
		return nil, err
	}
	if n := len(t.GroupsOfKind(KindGlobalEpoch, "")); n > 1 {
		return nil, invalid("groups: %d global-epoch groups, at most one is allowed", n)
	}
	for _, r := range t.Regions {
		if n := len(t.GroupsOfKind(KindPublisher, r)); n > 1 {
			return nil, invalid("region %q: %d publishers, at most one is allowed", r, n)
		}
		n := len(t.GroupsOfKind(KindDirectory, r))
		if n > 1 {
			return nil, invalid("region %q: %d directory groups, at most one is allowed", r, n)
		}
		if n == 0 && len(t.GroupsOfKind(KindRange, r)) > 0 {
			return nil, invalid("region %q homes ranges but has no directory group (add {id: N, kind: directory, region: %s})", r, r)
		}
	}
	// The global epoch service pushes to every publisher within half a lease
	// (epoch.Global), so the farthest publisher must be well inside it.
	if len(t.GroupsOfKind(KindGlobalEpoch, "")) == 1 {
		if far := t.FarthestPublisherRTT(); 2*far >= t.PublisherLease {
			return nil, invalid("publisher_lease %v must exceed twice the largest round trip between the global epoch service and a publisher (%v)", t.PublisherLease, far)
		}
	}
	return t, nil
}

// FarthestPublisherRTT returns the largest round trip between a node of
// the global epoch service and a publisher's region (0 without either):
// the floor of the global epoch's interval (DESIGN.md §7).
func (t *Topology) FarthestPublisherRTT() time.Duration {
	var far time.Duration
	for _, g := range t.GroupsOfKind(KindGlobalEpoch, "") {
		for _, id := range g.Replicas {
			from, _ := t.Node(id)
			if p, ok := t.FarthestPublisher(from.Region); ok {
				far = max(far, t.RTT(from.Region, p.Region))
			}
		}
	}
	return far
}

// FarthestPublisher returns the publisher group whose region is farthest
// (by RTT) from region, the first listed among equals; ok is false when
// the topology has no publisher.
func (t *Topology) FarthestPublisher(region string) (far Group, ok bool) {
	for _, p := range t.GroupsOfKind(KindPublisher, "") {
		if !ok || t.RTT(region, p.Region) > t.RTT(region, far.Region) {
			far, ok = p, true
		}
	}
	return far, ok
}

// checkRanges requires the ranges, if any, to tile the key space: sorted by
// start, the first starts at "", each ends where the next starts, the last is
// unbounded.
func (t *Topology) checkRanges() error {
	ranges := t.Ranges()
	if len(ranges) == 0 {
		return nil
	}
	if len(ranges[0].Start) != 0 {
		return invalid("ranges: keys below %q belong to no range (the first range must start at \"\")", ranges[0].Start)
	}
	for i := 1; i < len(ranges); i++ {
		prev, cur := ranges[i-1], ranges[i]
		if prev.End == nil || !bytes.Equal(prev.End, cur.Start) {
			return invalid("ranges %d and %d: range %d ends at %q but the next range starts at %q (gap or overlap)",
				prev.ID, cur.ID, prev.ID, prev.End, cur.Start)
		}
	}
	if last := ranges[len(ranges)-1]; last.End != nil {
		return invalid("ranges: keys from %q belong to no range (the last range must have no end)", last.End)
	}
	return nil
}

// Ranges returns the range groups sorted by start key.
func (t *Topology) Ranges() []Group {
	out := t.GroupsOfKind(KindRange, "")
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Start, out[j].Start) < 0 })
	return out
}

// RangeFor returns the range that holds key; ok is false if the topology has no ranges.
func (t *Topology) RangeFor(key []byte) (Group, bool) {
	for _, g := range t.Ranges() {
		if g.Contains(key) {
			return g, true
		}
	}
	return Group{}, false
}

// placeReplicas returns the group's replicas: the listed ones, or the first
// `replication` nodes of its region.
func (t *Topology) placeReplicas(g fileGroup) ([]uint64, error) {
	if len(g.Replicas) > 0 {
		if g.Replication != 0 && g.Replication != len(g.Replicas) {
			return nil, invalid("group %d: replication %d disagrees with %d listed replicas", g.ID, g.Replication, len(g.Replicas))
		}
		seen := map[uint64]bool{}
		for _, id := range g.Replicas {
			n, ok := t.Node(id)
			if !ok {
				return nil, invalid("group %d: unknown replica node %d", g.ID, id)
			}
			if seen[id] {
				return nil, invalid("group %d: node %d listed twice", g.ID, id)
			}
			if n.Region != g.Region && Kind(g.Kind) != KindGlobalEpoch {
				return nil, invalid("group %d: replica node %d is in %q, not the group's region %q", g.ID, id, n.Region, g.Region)
			}
			seen[id] = true
		}
		out := append([]uint64(nil), g.Replicas...)
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out, nil
	}
	want := g.Replication
	if want == 0 {
		want = DefaultReplicas
	}
	var out []uint64
	for _, n := range t.Nodes {
		if n.Region == g.Region && len(out) < want {
			out = append(out, n.ID)
		}
	}
	if len(out) < want {
		return nil, invalid("group %d: too few nodes in region %q for %d replicas (have %d)", g.ID, g.Region, want, len(out))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func pairKey(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Node returns the node with the given ID.
func (t *Topology) Node(id uint64) (Node, bool) {
	i, ok := t.nodeByID[id]
	if !ok {
		return Node{}, false
	}
	return t.Nodes[i], true
}

// Group returns the group with the given ID.
func (t *Topology) Group(id uint64) (Group, bool) {
	for _, g := range t.Groups {
		if g.ID == id {
			return g, true
		}
	}
	return Group{}, false
}

// HasRegion reports whether region is declared.
func (t *Topology) HasRegion(region string) bool {
	for _, r := range t.Regions {
		if r == region {
			return true
		}
	}
	return false
}

// RTT returns the configured round-trip time between two regions; zero within a region
// or for an unknown pair.
func (t *Topology) RTT(a, b string) time.Duration {
	if a == b {
		return 0
	}
	return t.rtt[pairKey(a, b)]
}

// GroupsOn returns the groups that have a replica on node id, in file order.
func (t *Topology) GroupsOn(id uint64) []Group {
	var out []Group
	for _, g := range t.Groups {
		for _, r := range g.Replicas {
			if r == id {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// GroupsOfKind returns the groups of one kind in region (any region if region is "").
func (t *Topology) GroupsOfKind(kind Kind, region string) []Group {
	var out []Group
	for _, g := range t.Groups {
		if g.Kind == kind && (region == "" || g.Region == region) {
			out = append(out, g)
		}
	}
	return out
}

// WithAddrs returns a copy of t whose node addresses are replaced by addrs[node ID];
// nodes missing from addrs keep theirs. The in-process cluster uses it after binding
// ephemeral ports.
func (t *Topology) WithAddrs(addrs map[uint64]string) *Topology {
	c := *t
	c.Nodes = append([]Node(nil), t.Nodes...)
	for i := range c.Nodes {
		if a, ok := addrs[c.Nodes[i].ID]; ok {
			c.Nodes[i].Addr = a
		}
	}
	return &c
}

// Marshal renders t back to the YAML file format, so a topology built in memory
// (the in-process cluster's, with its bound ports) can be handed to other processes.
func (t *Topology) Marshal() ([]byte, error) {
	f := fileTopology{
		LocalEpochInterval: t.LocalEpochInterval.String(),
		LocalEpochIdle:     "off",
		RaftTick:           t.RaftTick.String(),
		PublisherLease:     t.PublisherLease.String(),
		OrphanAfter:        t.OrphanAfter.String(),
		SplitSize:          "off",
		SplitQPS:           "off",
		QuietEpochs:        t.QuietEpochs,
		Regions:            t.Regions,
		GCTTL:              t.GCTTL.String(),
		TxnRecordGrace:     t.TxnRecordGrace.String(),
		ClosedInterval:     t.ClosedEpochInterval.String(),
		RangeLeaseEpochs:   t.RangeLeaseEpochs,
		RangeLeaseRenew:    t.RangeLeaseRenewEpochs,
		LivenessTimeout:    t.LivenessTimeout.String(),
		ReplaceAfter:       "off",
		MaxSnapshots:       t.MaxSnapshots,
		RebalanceInterval:  "off",
	}
	if t.RebalanceInterval > 0 {
		f.RebalanceInterval = t.RebalanceInterval.String()
	}
	if t.ReplaceAfter > 0 {
		f.ReplaceAfter = t.ReplaceAfter.String()
	}
	if t.AutoExcludeAfter > 0 {
		f.AutoExcludeAfter = t.AutoExcludeAfter.String()
	}
	if t.AutoRehomeAfter > 0 {
		f.AutoRehomeAfter = t.AutoRehomeAfter.String()
	}
	if t.SplitSize > 0 {
		f.SplitSize = strconv.FormatUint(t.SplitSize, 10) + "B"
	}
	if t.SplitQPS > 0 {
		f.SplitQPS = strconv.FormatFloat(t.SplitQPS, 'f', -1, 64)
	}
	f.MergeSize, f.MergeQPS, f.MergeDelay = "off", "off", t.MergeDelay.String()
	if t.MergeSize > 0 {
		f.MergeSize = strconv.FormatUint(t.MergeSize, 10) + "B"
	}
	if t.MergeQPS > 0 {
		f.MergeQPS = strconv.FormatFloat(t.MergeQPS, 'f', -1, 64)
	}
	if t.GlobalEpochMinInterval > 0 {
		f.GlobalMinInterval = t.GlobalEpochMinInterval.String()
	}
	f.GlobalIdle = "off"
	if t.GlobalEpochIdleInterval > 0 {
		f.GlobalIdle = t.GlobalEpochIdleInterval.String()
	}
	if t.LocalEpochIdleInterval > t.LocalEpochInterval {
		f.LocalEpochIdle = t.LocalEpochIdleInterval.String()
	}
	for i, a := range t.Regions {
		for _, b := range t.Regions[i+1:] {
			f.RTT = append(f.RTT, fileRTT{Between: []string{a, b}, MS: float64(t.RTT(a, b)) / float64(time.Millisecond)})
		}
	}
	for _, n := range t.Nodes {
		f.Nodes = append(f.Nodes, fileNode{ID: n.ID, Region: n.Region, Addr: n.Addr})
	}
	for _, g := range t.Groups {
		fg := fileGroup{ID: g.ID, Kind: string(g.Kind), Region: g.Region, Replicas: g.Replicas}
		if g.Kind == KindRange {
			start := string(g.Start)
			fg.Start = &start
			if g.End != nil {
				end := string(g.End)
				fg.End = &end
			}
		}
		f.Groups = append(f.Groups, fg)
	}
	return yaml.Marshal(&f)
}

// WithNode returns a copy of t with node n added, hosting no group (a node
// that joins; DESIGN.md §12). Errors wrap ErrInvalid: an ID of 0 or in
// use, a region t does not have, an address in use or not host:port.
func (t *Topology) WithNode(n Node) (*Topology, error) {
	switch {
	case n.ID == 0:
		return nil, invalid("node: id 0 is reserved")
	case !t.HasRegion(n.Region):
		return nil, invalid("node %d: unknown region %q (regions: %s)", n.ID, n.Region, strings.Join(t.Regions, ", "))
	}
	if _, dup := t.nodeByID[n.ID]; dup {
		return nil, invalid("node %d: id already in use", n.ID)
	}
	if _, _, err := net.SplitHostPort(n.Addr); err != nil {
		return nil, invalid("node %d: address %q is not host:port", n.ID, n.Addr)
	}
	for _, o := range t.Nodes {
		if o.Addr == n.Addr {
			return nil, invalid("node %d: duplicate address %s (also node %d)", n.ID, n.Addr, o.ID)
		}
	}
	c := *t
	c.Nodes = append(slices.Clone(t.Nodes), n)
	c.nodeByID = maps.Clone(t.nodeByID)
	c.nodeByID[n.ID] = len(c.Nodes) - 1
	return &c, nil
}

// WithoutGlobalEpoch returns a copy of t without its global epoch service and
// publishers: a regional-only deployment of the same nodes and ranges, whose
// versions carry local epochs (the lower bound `bench compare` measures).
func (t *Topology) WithoutGlobalEpoch() *Topology {
	c := *t
	c.Groups = nil
	for _, g := range t.Groups {
		if g.Kind != KindGlobalEpoch && g.Kind != KindPublisher {
			c.Groups = append(c.Groups, g)
		}
	}
	return &c
}
