package node

import (
	"context"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/rangeserver"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/rebalance"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// Latency buckets: 50 µs to about 1.6 s, doubling.
var latencyBuckets = prometheus.ExponentialBuckets(50e-6, 2, 16)

// metrics are the node's Prometheus series beyond Raft's (raftgroup.Metrics):
// RPCs served, transactions by kind and outcome, snapshot reads by mode with
// their waits, lock-table waits, epoch advance intervals, and, read at each
// scrape, epochs and their freshness, lock tables, Pebble and the Go runtime.
type metrics struct {
	rpcs        *prometheus.HistogramVec // method, code
	txns        *prometheus.CounterVec   // kind, outcome
	commit      *prometheus.HistogramVec // kind
	snapEpoch   *prometheus.HistogramVec // mode
	snapLock    *prometheus.HistogramVec // mode
	lockWait    prometheus.Histogram
	stage       *prometheus.HistogramVec // stage
	readAhead   prometheus.Counter
	closedLag   prometheus.Histogram
	closes      *prometheus.CounterVec   // via
	epochChange *prometheus.HistogramVec // kind
	epochRound  *prometheus.HistogramVec // phase

	// The commit path's series, resolved once: by kind (one_phase,
	// two_phase) and outcome, and by snapshot mode.
	txnCount   [2][4]prometheus.Counter
	commitTime [2]prometheus.Observer
	snapWaits  [3][2]prometheus.Observer            // mode × (epoch, lock)
	phases     [epoch.NumPhases]prometheus.Observer // by epoch.Phase

	// observers caches each method's histograms by code (a *[17]prometheus.Observer
	// per method), so the hot path neither locks nor hashes labels.
	observers sync.Map
}

func newMetrics(reg prometheus.Registerer, n *Node) *metrics {
	m := &metrics{
		rpcs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "terroir_rpc_server_seconds", Help: "RPCs served by this node, by method (Service/Method) and gRPC code, and how long each took.",
			Buckets: latencyBuckets,
		}, []string{"method", "code"}),
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "terroir_transactions_total",
			Help: "Transaction outcomes decided at this node: kind one_phase (a single-range commit at its leader) or two_phase (the commit record at the txn-state leader); outcome committed, aborted, not_executed (not the leader: the client retries elsewhere) or error.",
		}, []string{"kind", "outcome"}),
		commit: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "terroir_transaction_commit_seconds", Help: "Time to serve a commit that succeeded: a one-phase commit, or a two-phase commit record.",
			Buckets: latencyBuckets,
		}, []string{"kind"}),
		snapEpoch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "terroir_snapshot_read_epoch_wait_seconds", Help: "Time a snapshot read waited at this range leader for its epoch, by mode (global, regional, closed).",
			Buckets: latencyBuckets,
		}, []string{"mode"}),
		snapLock: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "terroir_snapshot_read_lock_wait_seconds", Help: "Time a snapshot read waited at this range leader for exclusive locks to clear, by mode.",
			Buckets: latencyBuckets,
		}, []string{"mode"}),
		lockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "terroir_lock_wait_seconds", Help: "Time each lock acquisition spent in a range leader's lock table.",
			Buckets: latencyBuckets,
		}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "terroir_commit_stage_seconds", Help: "Time a one-phase commit spent at its range leader in each stage: locks (a one-shot's locks taken, waits included), epochs (the local and global epochs read, and beside them the write set's newest versions looked up), replicate (its writes proposed, committed and applied).",
			Buckets: latencyBuckets,
		}, []string{"stage"}),
		readAhead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "terroir_commit_epochs_read_ahead_total", Help: "One-phase commits at this node's range leaders whose epochs were read ahead, at the transaction's last Lock, rather than after the commit arrived (issue 17): an interactive write's commit waits no round of epoch reads.",
		}),
		closedLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "terroir_closed_epoch_lag_epochs", Help: "A range leader's closed-epoch lag each time it begins a close (DESIGN.md §13): its publisher's epoch minus the range's closed epoch. A follower read at the publisher's epoch e needs a lag of at most 1.",
			Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256},
		}),
		closes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "terroir_closed_epochs_total", Help: "Epochs closed by this node's range leaders (DESIGN.md §13), by how the close went: through the range's Raft log (log), or outside it to the other replicas, for a range idle since its last close (side).",
		}, []string{"via"}),
		epochChange: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "terroir_epoch_advance_interval_seconds", Help: "Time between two changes of an epoch applied at this node, by group kind (local-epoch, publisher, global-epoch).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 1.5, 20),
		}, []string{"kind"}),
		epochRound: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "terroir_global_epoch_round_seconds",
			Help:    "The global epoch's round, phase by phase (DESIGN.md §7): at the service's leader, publish (every publisher acknowledged epoch E: the farthest one's RTT plus its update), advance (E+1 committed and applied by a majority of the service) and advance_commit (its first part, until the leader applied E+1); at a publisher's leader, for each update, publisher_commit (E committed and applied here) and publisher_certify (then until a majority read shows it).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 1.5, 20),
		}, []string{"phase"}),
	}
	// Every series a dashboard plots exists from the start, at zero.
	for k, kind := range txnKinds {
		m.commitTime[k] = m.commit.WithLabelValues(kind)
		for o, outcome := range txnOutcomes {
			m.txnCount[k][o] = m.txns.WithLabelValues(kind, outcome)
		}
	}
	for i, mode := range snapModes {
		m.snapWaits[i] = [2]prometheus.Observer{m.snapEpoch.WithLabelValues(mode), m.snapLock.WithLabelValues(mode)}
	}
	for p := range epoch.NumPhases {
		m.phases[p] = m.epochRound.WithLabelValues(p.String())
	}
	reg.MustRegister(m.rpcs, m.txns, m.commit, m.snapEpoch, m.snapLock, m.lockWait, m.stage, m.readAhead, m.closedLag, m.closes, m.epochChange, m.epochRound,
		goCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{n: n})
	return m
}

// observeRound implements epoch.RoundObserver.
func (m *metrics) observeRound(p epoch.Phase, d time.Duration) {
	if int(p) < len(m.phases) {
		m.phases[p].Observe(d.Seconds())
	}
}

// Label values of the commit path's series; the constants index them.
var (
	txnKinds    = [2]string{"one_phase", "two_phase"}
	txnOutcomes = [4]string{"committed", "aborted", "not_executed", "error"}
	snapModes   = [3]string{"global", "regional", "closed"}
)

const (
	onePhase, twoPhase = 0, 1
	committed          = 0
)

// rpcObserver returns the histogram of method and code.
func (m *metrics) rpcObserver(method string, code codes.Code) prometheus.Observer {
	v, ok := m.observers.Load(method)
	if !ok {
		v, _ = m.observers.LoadOrStore(method, new([codes.Unauthenticated + 1]atomic.Pointer[prometheus.Observer]))
	}
	byCode := v.(*[codes.Unauthenticated + 1]atomic.Pointer[prometheus.Observer])
	if code > codes.Unauthenticated {
		return m.rpcs.WithLabelValues(method, code.String())
	}
	if o := byCode[code].Load(); o != nil {
		return *o
	}
	o := m.rpcs.WithLabelValues(method, code.String())
	byCode[code].Store(&o)
	return o
}

// unary is the server interceptor that records every RPC, and what the
// transactions and snapshot reads among them did.
func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	began := time.Now()
	resp, err := handler(ctx, req)
	took := time.Since(began)
	code := status.Code(err)
	// "Service/Method": Range/Get and TxnState/Get are different series.
	method := info.FullMethod[strings.LastIndex(info.FullMethod, ".")+1:]
	m.rpcObserver(method, code).Observe(took.Seconds())
	switch method {
	case "Range/CommitOnePhase":
		m.txn(onePhase, outcome(code, err == nil), took)
	case "TxnState/Decide":
		ok := err == nil && resp.(*txnstatepb.DecideResponse).GetRecord().GetOutcome() == txnstatepb.Outcome_OUTCOME_COMMITTED
		m.txn(twoPhase, outcome(code, ok), took)
	case "Range/SnapshotRead":
		if err == nil {
			q, r := req.(*pb.SnapshotReadRequest), resp.(*pb.SnapshotReadResponse)
			mode := 0 // global
			switch {
			case q.GetRegional():
				mode = 1
			case q.GetClosed():
				mode = 2
			}
			m.snapWaits[mode][0].Observe(float64(r.GetEpochWaitUs()) / 1e6)
			m.snapWaits[mode][1].Observe(float64(r.GetLockWaitUs()) / 1e6)
		}
	}
	return resp, err
}

// outcome indexes txnOutcomes by what a commit RPC did.
func outcome(code codes.Code, committed bool) int {
	switch {
	case code == codes.OK && committed:
		return 0
	case code == codes.OK, code == codes.Aborted:
		return 1
	case code == codes.FailedPrecondition, code == codes.NotFound, code == codes.OutOfRange:
		return 2
	default:
		return 3
	}
}

func (m *metrics) txn(kind, outcome int, took time.Duration) {
	m.txnCount[kind][outcome].Inc()
	if outcome == committed {
		m.commitTime[kind].Observe(took.Seconds())
	}
}

// stateCollector reads the node's state at each scrape: epochs and their
// freshness, leaders, lock tables, and Pebble's metrics.
type stateCollector struct{ n *Node }

var (
	descEpoch      = prometheus.NewDesc("terroir_epoch", "The epoch applied by this node's replica of an epoch group.", []string{"group", "kind", "region"}, nil)
	descEpochAge   = prometheus.NewDesc("terroir_epoch_age_seconds", "Time since the epoch of this node's replica last changed: a publisher's freshness (NaN until it changes once).", []string{"group", "kind", "region"}, nil)
	descLeaders    = prometheus.NewDesc("terroir_raft_leaders", "Groups this node's replicas lead.", nil, nil)
	descReplicas   = prometheus.NewDesc("terroir_replicas", "Replicas hosted by this node, by group kind.", []string{"kind"}, nil)
	descLocks      = prometheus.NewDesc("terroir_locks_held", "Locks held in the lock tables of the ranges this node leads.", nil, nil)
	descRangeBytes = prometheus.NewDesc("terroir_range_bytes", "Estimated bytes on disk of the ranges hosted here.", nil, nil)
	descQueueSteps = prometheus.NewDesc("terroir_rebalance_steps_total", "Steps the region's replicate queue ran from this node (while it led the region's directory), by kind (move, transfer, gone, move group) and outcome (done, failed).", []string{"kind", "outcome"}, nil)
	descQueueBusy  = prometheus.NewDesc("terroir_rebalance_steps_in_flight", "Steps of the region's replicate queue under way at this node.", nil, nil)
	// The node's epoch readers (epoch.ReaderStats), by the kind and region
	// of the group read: where a commit's epoch read spends its time.
	descReadRounds = prometheus.NewDesc("terroir_epoch_read_rounds_total", "Batched rounds of linearizable epoch reads this node's reader of a group ran.", []string{"kind", "region"}, nil)
	descReads      = prometheus.NewDesc("terroir_epoch_reads_total", "Epoch reads those rounds answered.", []string{"kind", "region"}, nil)
	descReadWait   = prometheus.NewDesc("terroir_epoch_read_wait_seconds_total", "Time those reads waited for their round to begin (a read arriving during a round waits for it to end), summed over the reads.", []string{"kind", "region"}, nil)
	descReadRound  = prometheus.NewDesc("terroir_epoch_read_round_seconds_total", "Time those rounds took to decide the group's epoch, summed over the rounds.", []string{"kind", "region"}, nil)
	pebbleGauges   = []struct {
		d *prometheus.Desc
		f func(s pebbleStats) float64
	}{
		{prometheus.NewDesc("terroir_pebble_read_amplification", "Pebble read amplification: L0 sublevels plus non-empty lower levels.", nil, nil), func(s pebbleStats) float64 { return s.readAmp }},
		{prometheus.NewDesc("terroir_pebble_l0_files", "Tables in L0.", nil, nil), func(s pebbleStats) float64 { return s.l0Files }},
		{prometheus.NewDesc("terroir_pebble_disk_usage_bytes", "Disk space used by the store, live and obsolete files.", nil, nil), func(s pebbleStats) float64 { return s.disk }},
		{prometheus.NewDesc("terroir_pebble_memtable_bytes", "Bytes in memtables.", nil, nil), func(s pebbleStats) float64 { return s.memtable }},
		{prometheus.NewDesc("terroir_pebble_wal_bytes", "Live bytes in WAL files.", nil, nil), func(s pebbleStats) float64 { return s.wal }},
		{prometheus.NewDesc("terroir_pebble_compaction_debt_bytes", "Estimated bytes compactions still owe.", nil, nil), func(s pebbleStats) float64 { return s.debt }},
		{prometheus.NewDesc("terroir_pebble_block_cache_bytes", "Bytes in the block cache.", nil, nil), func(s pebbleStats) float64 { return s.cacheSize }},
		{prometheus.NewDesc("terroir_storage_row_cache_bytes", "Bytes in the store's newest-version cache (keys, values and their overhead).", nil, nil), func(s pebbleStats) float64 { return s.rowBytes }},
	}
	pebbleCounters = []struct {
		d *prometheus.Desc
		f func(s pebbleStats) float64
	}{
		{prometheus.NewDesc("terroir_pebble_compactions_total", "Compactions run.", nil, nil), func(s pebbleStats) float64 { return s.compactions }},
		{prometheus.NewDesc("terroir_pebble_flushes_total", "Memtable flushes.", nil, nil), func(s pebbleStats) float64 { return s.flushes }},
		{prometheus.NewDesc("terroir_pebble_wal_written_bytes_total", "Bytes written to the WAL.", nil, nil), func(s pebbleStats) float64 { return s.walWritten }},
		{prometheus.NewDesc("terroir_pebble_flushed_bytes_total", "Bytes written to tables (and blob files) by memtable flushes.", nil, nil), func(s pebbleStats) float64 { return s.flushed }},
		{prometheus.NewDesc("terroir_pebble_write_stalls_total", "Times the store held back every write until flushes or compactions caught up.", nil, nil), func(s pebbleStats) float64 { return s.stalls }},
		{prometheus.NewDesc("terroir_pebble_write_stall_seconds_total", "Time the store's writes spent held back by write stalls.", nil, nil), func(s pebbleStats) float64 { return s.stallSecs }},
		{prometheus.NewDesc("terroir_pebble_compacted_bytes_total", "Bytes written to tables (and blob files) by compactions: with the WAL's and the flushes', what the store wrote to disk.", nil, nil), func(s pebbleStats) float64 { return s.compacted }},
		{prometheus.NewDesc("terroir_pebble_compacted_blob_bytes_total", "Of terroir_pebble_compacted_bytes_total, the bytes written to blob files: separated values that compactions wrote anew (to restore their locality, or to reclaim a blob file's garbage).", nil, nil), func(s pebbleStats) float64 { return s.compactedBlob }},
		{prometheus.NewDesc("terroir_pebble_block_cache_hits_total", "Block cache hits.", nil, nil), func(s pebbleStats) float64 { return s.hits }},
		{prometheus.NewDesc("terroir_pebble_block_cache_misses_total", "Block cache misses.", nil, nil), func(s pebbleStats) float64 { return s.misses }},
		{prometheus.NewDesc("terroir_storage_row_cache_hits_total", "Reads of a key's newest version the store's newest-version cache answered.", nil, nil), func(s pebbleStats) float64 { return s.rowHits }},
		{prometheus.NewDesc("terroir_storage_row_cache_misses_total", "Reads of a key's newest version that went to Pebble.", nil, nil), func(s pebbleStats) float64 { return s.rowMisses }},
	}
)

type pebbleStats struct {
	readAmp, l0Files, disk, memtable, wal, debt, cacheSize float64
	compactions, flushes, walWritten, hits, misses         float64
	flushed, compacted, compactedBlob, stalls, stallSecs   float64
	rowHits, rowMisses, rowBytes                           float64
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEpoch, descEpochAge, descLeaders, descReplicas, descLocks, descRangeBytes, descQueueSteps, descQueueBusy,
		descReadRounds, descReads, descReadWait, descReadRound} {
		ch <- d
	}
	for _, g := range pebbleGauges {
		ch <- g.d
	}
	for _, g := range pebbleCounters {
		ch <- g.d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	now := time.Now()
	leaders := 0
	kinds := map[string]int{}
	for _, h := range n.hostedGroups() {
		kinds[string(h.g.Kind)]++
		if h.rg.IsLeader() {
			leaders++
		}
		if h.epoch == nil {
			continue
		}
		labels := []string{strconv.FormatUint(h.g.ID, 10), string(h.g.Kind), h.g.Region}
		ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(h.epoch.Epoch()), labels...)
		age := math.NaN()
		if t := h.epoch.Changed(); !t.IsZero() {
			age = now.Sub(t).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descEpochAge, prometheus.GaugeValue, age, labels...)
	}
	var locks, bytes float64
	for _, r := range n.rangeReplicas() {
		kinds["range"]++
		st := r.Status()
		if st.GetLeader() {
			leaders++
			locks += float64(st.GetLocks())
		}
		bytes += float64(st.GetSizeBytes())
	}
	ch <- prometheus.MustNewConstMetric(descLeaders, prometheus.GaugeValue, float64(leaders))
	for k, v := range kinds {
		ch <- prometheus.MustNewConstMetric(descReplicas, prometheus.GaugeValue, float64(v), k)
	}
	ch <- prometheus.MustNewConstMetric(descLocks, prometheus.GaugeValue, locks)
	ch <- prometheus.MustNewConstMetric(descRangeBytes, prometheus.GaugeValue, bytes)
	if n.queue != nil {
		st := n.queue.Stats()
		for _, k := range rebalance.Kinds {
			ch <- prometheus.MustNewConstMetric(descQueueSteps, prometheus.CounterValue, float64(st.Done[k]), k.String(), "done")
			ch <- prometheus.MustNewConstMetric(descQueueSteps, prometheus.CounterValue, float64(st.Failed[k]), k.String(), "failed")
		}
		ch <- prometheus.MustNewConstMetric(descQueueBusy, prometheus.GaugeValue, float64(st.InFlight))
	}
	for key, st := range n.readerStats() {
		kind, region, _ := strings.Cut(key, "/")
		ch <- prometheus.MustNewConstMetric(descReadRounds, prometheus.CounterValue, float64(st.Rounds), kind, region)
		ch <- prometheus.MustNewConstMetric(descReads, prometheus.CounterValue, float64(st.Reads), kind, region)
		ch <- prometheus.MustNewConstMetric(descReadWait, prometheus.CounterValue, st.Waited.Seconds(), kind, region)
		ch <- prometheus.MustNewConstMetric(descReadRound, prometheus.CounterValue, st.InRounds.Seconds(), kind, region)
	}
	pm := n.engine.Metrics()
	s := pebbleStats{
		readAmp: float64(pm.ReadAmp()), l0Files: float64(pm.Levels[0].TablesCount), disk: float64(pm.DiskSpaceUsage()),
		memtable: float64(pm.MemTable.Size), wal: float64(pm.WAL.Size), debt: float64(pm.Compact.EstimatedDebt),
		cacheSize: float64(pm.BlockCache.Size), compactions: float64(pm.Compact.Count), flushes: float64(pm.Flush.Count),
		walWritten: float64(pm.WAL.BytesWritten), hits: float64(pm.BlockCache.Hits), misses: float64(pm.BlockCache.Misses),
	}
	rc := n.engine.RowCacheStats()
	s.rowHits, s.rowMisses, s.rowBytes = float64(rc.Hits), float64(rc.Misses), float64(rc.Bytes)
	stalls, stalled := n.engine.WriteStalls()
	s.stalls, s.stallSecs = float64(stalls), stalled.Seconds()
	flushed, compacted, rewritten := storage.BytesWritten(pm)
	s.flushed, s.compacted, s.compactedBlob = float64(flushed), float64(compacted), float64(rewritten)
	for _, g := range pebbleGauges {
		ch <- prometheus.MustNewConstMetric(g.d, prometheus.GaugeValue, g.f(s))
	}
	for _, g := range pebbleCounters {
		ch <- prometheus.MustNewConstMetric(g.d, prometheus.CounterValue, g.f(s))
	}
}

// Gather returns the node's metrics as Prometheus gathers them for
// /metrics: a benchmark reads the counters of every node before and after
// its run (commands per transaction).
func (n *Node) Gather() ([]*dto.MetricFamily, error) { return n.registry.Gather() }

// goCollector exports the Go runtime's default series and three more an
// operator needs when a loaded node loses Raft leaders or slows: how long
// runnable goroutines waited to run (go_sched_latencies_seconds, a
// histogram in seconds: waits of a few hundred ms delay Raft's messages past
// its election timeout, issue 17), the CPU the garbage collector spent
// (go_cpu_classes_gc_total_cpu_seconds_total, in seconds), and the Go
// processors the binary runs now (go_sched_gomaxprocs_threads, a gauge:
// internal/procs adds some while goroutines wait long for one).
func goCollector() prometheus.Collector {
	return collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/latencies:seconds$`)},
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/gc/total:cpu-seconds$`)},
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/gomaxprocs:threads$`)},
	))
}

// commitStages returns the stage histogram's series, by rangeserver.CommitStage.
func (m *metrics) commitStages() [rangeserver.NumCommitStages]prometheus.Observer {
	var out [rangeserver.NumCommitStages]prometheus.Observer
	for s := range rangeserver.NumCommitStages {
		out[s] = m.stage.WithLabelValues(s.String())
	}
	return out
}
