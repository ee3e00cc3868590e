package main

import (
	"fmt"
	"runtime/metrics"
	"sort"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/terroir-db/terroir/internal/experiment"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/procs"
)

// runCost is what the embedded cluster and its driver had spent at one
// moment: the process's CPU time and the nodes' counters of the commands
// that make up a transaction (issue 17: a benchmark that explains itself).
type runCost struct {
	// cpu is the process's CPU time, sys the part of it in the kernel;
	// at when it was sampled, procsExtra how long the binary had run its
	// extra Go processors by then (procsExtraTime).
	cpu, sys, procsExtra time.Duration
	// calls is the process's read and write system calls (callsOK false:
	// /proc/self/io could not be read).
	calls                  syscalls
	callsOK                bool
	at                     time.Time
	rpcs, proposals, syncs float64
	// raftMsgs is the Raft messages the nodes sent each other
	// (terroir_raft_messages_sent_total), heartbeats those that were
	// heartbeats or replies to them.
	raftMsgs, heartbeats float64
	// wal, flushed and compacted are the bytes the nodes' stores wrote to
	// disk: to the WAL, by memtable flushes and by compactions.
	// compactedBlob is the part of compacted written to blob files.
	wal, flushed, compacted, compactedBlob float64
	// rowHits and rowMisses are the reads of a key's newest version the
	// stores' newest-version caches answered, and those they did not.
	rowHits, rowMisses float64
	// stalled is the seconds the stores held back all writes (summed
	// over the nodes).
	stalled float64
	// epochReads and epochRounds are the reads the nodes' epoch readers
	// answered and the rounds they ran; epochWaited the seconds those
	// reads waited for their round to begin, epochInRounds the seconds the
	// rounds took to decide (terroir_epoch_read*_total).
	epochReads, epochRounds, epochWaited, epochInRounds float64
	// syncSecs and applySecs are the seconds the nodes' Raft groups spent
	// writing their Readys' appends durably and applying their committed
	// entries, applies how many Readys applied some
	// (terroir_raft_{append_sync,apply}_seconds): what a group's goroutine
	// is busy with while proposals and messages wait for it.
	syncSecs, applySecs, applies float64
	// gcCPU is the CPU seconds the Go garbage collector spent, gcCycles
	// the collections completed, and sched the process's histogram of how
	// long runnable goroutines waited to run (runtime/metrics; all three
	// cumulative since the process started).
	gcCPU, gcCycles float64
	sched           *metrics.Float64Histogram
	// device is what the block device of the cluster's data directory
	// had written, by every process (deviceOK false: none, as on a tmpfs).
	device   experiment.DeviceWrites
	deviceOK bool
	// byMethod is rpcs by RPC method (terroir_rpc_server_seconds'
	// method label).
	byMethod map[string]float64
	// stages is terroir_commit_stage_seconds by stage label: the seconds
	// one-phase commits spent in the stage, and how many did.
	stages map[string]stageTime
}

// stageTime is a commit stage's total seconds and count (a histogram's sum
// and sample count).
type stageTime struct{ seconds, count float64 }

// runtimeSamples are the runtime/metrics names sampleCost reads, in the
// order it reads them.
var runtimeSamples = []metrics.Sample{
	{Name: "/cpu/classes/gc/total:cpu-seconds"},
	{Name: "/gc/cycles/total:gc-cycles"},
	{Name: "/sched/latencies:seconds"},
}

// sampleCost reads the process's CPU time (user + system) and, summed over
// c's running nodes, the RPCs they served (terroir_rpc_server_seconds),
// the Raft entries proposed (terroir_raft_proposals_total), the Raft
// messages sent (terroir_raft_messages_sent_total, heartbeats apart), the Raft
// log appends synced to disk (terroir_raft_append_sync_seconds) and the
// bytes their stores wrote (terroir_pebble_{wal_written,flushed,compacted,compacted_blob}_bytes_total)
// and the time their writes stalled (terroir_pebble_write_stall_seconds_total).
func sampleCost(c *localcluster.Cluster) runCost {
	out := runCost{byMethod: map[string]float64{}, stages: map[string]stageTime{}, at: time.Now(), procsExtra: procsExtraTime()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		out.sys = time.Duration(ru.Stime.Nano())
	}
	out.calls, out.callsOK = selfSyscalls()
	out.device, out.deviceOK = experiment.ReadDeviceWrites(c.DataDir())
	counted := map[string]*float64{
		"terroir_rpc_server_seconds":                &out.rpcs,
		"terroir_raft_proposals_total":              &out.proposals,
		"terroir_raft_messages_sent_total":          &out.raftMsgs,
		"terroir_raft_append_sync_seconds":          &out.syncs,
		"terroir_pebble_wal_written_bytes_total":    &out.wal,
		"terroir_pebble_flushed_bytes_total":        &out.flushed,
		"terroir_pebble_compacted_bytes_total":      &out.compacted,
		"terroir_pebble_compacted_blob_bytes_total": &out.compactedBlob,
		"terroir_pebble_write_stall_seconds_total":  &out.stalled,
		"terroir_storage_row_cache_hits_total":      &out.rowHits,
		"terroir_storage_row_cache_misses_total":    &out.rowMisses,
		"terroir_epoch_reads_total":                 &out.epochReads,
		"terroir_epoch_read_rounds_total":           &out.epochRounds,
		"terroir_epoch_read_wait_seconds_total":     &out.epochWaited,
		"terroir_epoch_read_round_seconds_total":    &out.epochInRounds,
	}
	c.EachMetricFamily(func(mf *dto.MetricFamily) {
		if sum, ok := counted[mf.GetName()]; ok {
			*sum += sumMetric(mf)
		}
		addRPCsByMethod(mf, out.byMethod)
		addStages(mf, out.stages)
		switch mf.GetName() {
		case "terroir_raft_append_sync_seconds":
			out.syncSecs += histogramSum(mf)
		case "terroir_raft_apply_seconds":
			out.applySecs += histogramSum(mf)
			out.applies += sumMetric(mf)
		}
		out.heartbeats += heartbeatsSent(mf)
	})
	rs := make([]metrics.Sample, len(runtimeSamples))
	copy(rs, runtimeSamples)
	metrics.Read(rs)
	if rs[0].Value.Kind() == metrics.KindFloat64 {
		out.gcCPU = rs[0].Value.Float64()
	}
	if rs[1].Value.Kind() == metrics.KindUint64 {
		out.gcCycles = float64(rs[1].Value.Uint64())
	}
	if rs[2].Value.Kind() == metrics.KindFloat64Histogram {
		out.sched = rs[2].Value.Float64Histogram()
	}
	return out
}

// sumMetric adds up a family's counters, or its histograms' sample counts.
func sumMetric(mf *dto.MetricFamily) float64 {
	var sum float64
	for _, m := range mf.GetMetric() {
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// histogramSum is the sum of the samples of mf's histograms.
func histogramSum(mf *dto.MetricFamily) float64 {
	var sum float64
	for _, m := range mf.GetMetric() {
		sum += m.GetHistogram().GetSampleSum()
	}
	return sum
}

// rowCacheHits formats the share of the reads of a key's newest version
// that the stores' newest-version caches answered between two samples.
func rowCacheHits(before, after runCost) string {
	hits, misses := after.rowHits-before.rowHits, after.rowMisses-before.rowMisses
	if hits+misses <= 0 {
		return "(none read)"
	}
	return fmt.Sprintf("%.0f%% (of %.0f)", 100*hits/(hits+misses), hits+misses)
}

// kernelShare formats the part of the process's CPU spent in the kernel
// between two samples, and the read and write system calls per operation
// over ops operations (issue 17: the commit path's syscalls, loopback
// sockets and the WAL's writes).
func kernelShare(before, after runCost, ops int64) string {
	cpu := after.cpu - before.cpu
	if cpu <= 0 || ops <= 0 {
		return "no CPU time measured"
	}
	out := fmt.Sprintf("%.0f%% in the kernel", 100*float64(after.sys-before.sys)/float64(cpu))
	if before.callsOK && after.callsOK {
		out += fmt.Sprintf(", system calls %.2f reads and %.2f writes", float64(after.calls.reads-before.calls.reads)/float64(ops),
			float64(after.calls.writes-before.calls.writes)/float64(ops))
	}
	return out
}

// printCost prints what one operation cost between two samples over ops
// operations.
func printCost(before, after runCost, ops int64) {
	if ops <= 0 {
		return
	}
	per := func(a, b float64) float64 { return (b - a) / float64(ops) }
	fmt.Printf("per operation: CPU %.0f µs (the whole process: the cluster's nodes and the driver; %s), RPCs served %.2f, Raft proposals %.2f, log syncs %.2f (every replica's), Raft messages %.2f (heartbeats %.2f)\n",
		float64(after.cpu-before.cpu)/float64(time.Microsecond)/float64(ops), kernelShare(before, after, ops), per(before.rpcs, after.rpcs), per(before.proposals, after.proposals), per(before.syncs, after.syncs),
		per(before.raftMsgs, after.raftMsgs), per(before.heartbeats, after.heartbeats))
	fmt.Printf("per operation: disk writes %s (every store's)%s; writes stalled %s in all; newest versions read from the cache %s\n",
		diskPerOp(before, after, ops), deviceWrites(before, after, ops), stalledFor(before, after), rowCacheHits(before, after))
	printRPCsByMethod(before.byMethod, after.byMethod, ops)
	printStages(before.stages, after.stages)
	printEpochReads(before, after)
	printReadys(before, after)
	if cpu := (after.cpu - before.cpu).Seconds(); cpu > 0 {
		gc := after.gcCPU - before.gcCPU
		fmt.Printf("per operation: GC CPU %.0f µs (%.0f%% of the process's), %.2f GC cycles per 1000 operations; goroutines waited to run %s; extra Go processors %s\n",
			gc*1e6/float64(ops), 100*gc/cpu, 1000*per(before.gcCycles, after.gcCycles), schedWaits(before.sched, after.sched),
			extraShare(before, after))
	}
}

// schedWaits describes how long runnable goroutines waited to run between
// two cumulative samples of /sched/latencies:seconds: the P99 and the
// longest wait, each as its histogram bucket's upper bound.
func schedWaits(before, after *metrics.Float64Histogram) string {
	if before == nil || after == nil || len(before.Counts) != len(after.Counts) {
		return "(not sampled)"
	}
	counts, total := procs.CountsSince(after, before.Counts)
	if total == 0 {
		return "(no samples)"
	}
	upper := func(i int) time.Duration { // Buckets has len(Counts)+1 boundaries
		b := after.Buckets[i+1]
		if b > 1e9 { // the last bucket is unbounded above
			b = after.Buckets[i]
		}
		return time.Duration(b * float64(time.Second))
	}
	var p99, longest time.Duration
	var seen uint64
	rank := (total*99 + 99) / 100 // the P99 sample's rank, from 1
	for i, n := range counts {
		if n == 0 {
			continue
		}
		if seen < rank && seen+n >= rank {
			p99 = upper(i)
		}
		seen += n
		longest = upper(i)
	}
	return fmt.Sprintf("P99 ≤ %s, longest ≤ %s (%d samples)", fmtWait(p99), fmtWait(longest), total)
}

// fmtWait rounds a scheduling wait for printing: to µs under a
// millisecond, else to 0.1 ms.
func fmtWait(d time.Duration) string {
	if d < time.Millisecond {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(100 * time.Microsecond).String()
}

// diskPerOp is the bytes the stores wrote per operation between two
// samples, in KiB: in all, and to the WAL, by flushes and by compactions (and
// how much of the compactions' was separated values written anew).
func diskPerOp(before, after runCost, ops int64) string {
	kib := func(a, b float64) float64 { return (b - a) / 1024 / float64(ops) }
	wal, fl, co := kib(before.wal, after.wal), kib(before.flushed, after.flushed), kib(before.compacted, after.compacted)
	blob := kib(before.compactedBlob, after.compactedBlob)
	return fmt.Sprintf("%.1f KiB (WAL %.1f, flushes %.1f, compactions %.1f, of which values rewritten %.1f)", wal+fl+co, wal, fl, co, blob)
}

// deviceWrites gives the write requests the data directory's block device
// completed between two samples, per operation and per second, or "" when
// either sample has none (experiment.DeviceWrites: this machine's disk
// throttles write requests, issue 17).
func deviceWrites(before, after runCost, ops int64) string {
	secs := after.at.Sub(before.at).Seconds()
	if !before.deviceOK || !after.deviceOK || ops <= 0 || secs <= 0 {
		return ""
	}
	n := float64(after.device.Requests - before.device.Requests)
	return fmt.Sprintf("; the device's write requests %.2f (%.0f/s, every process's)", n/float64(ops), n/secs)
}

// stalledFor is how long the stores' writes stalled between two samples,
// summed over the nodes.
func stalledFor(before, after runCost) time.Duration {
	return time.Duration((after.stalled - before.stalled) * float64(time.Second)).Round(time.Millisecond)
}

// heartbeatsSent returns the Raft heartbeats and replies to them that mf
// counts, if mf is terroir_raft_messages_sent_total (0 otherwise).
func heartbeatsSent(mf *dto.MetricFamily) float64 {
	if mf.GetName() != "terroir_raft_messages_sent_total" {
		return 0
	}
	var n float64
	for _, m := range mf.GetMetric() {
		if t := labelValue(m, "type"); t == "MsgHeartbeat" || t == "MsgHeartbeatResp" {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// addRPCsByMethod adds mf's calls by RPC method to into, if mf is
// terroir_rpc_server_seconds (its method label; it is a histogram).
func addRPCsByMethod(mf *dto.MetricFamily, into map[string]float64) {
	if mf.GetName() != "terroir_rpc_server_seconds" {
		return
	}
	for _, m := range mf.GetMetric() {
		if method := labelValue(m, "method"); method != "" {
			into[method] += float64(m.GetHistogram().GetSampleCount())
		}
	}
}

// labelValue returns the value of m's label name ("" when m has none).
func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// addStages adds terroir_commit_stage_seconds' sums and counts, by stage,
// to stages.
func addStages(mf *dto.MetricFamily, stages map[string]stageTime) {
	if mf.GetName() != "terroir_commit_stage_seconds" {
		return
	}
	for _, m := range mf.GetMetric() {
		st := stages[labelValue(m, "stage")]
		st.seconds += m.GetHistogram().GetSampleSum()
		st.count += float64(m.GetHistogram().GetSampleCount())
		stages[labelValue(m, "stage")] = st
	}
}

// printStages prints the mean time one-phase commits spent in each stage at
// their range leaders between two samples of runCost.stages.
func printStages(before, after map[string]stageTime) {
	fmt.Println("per one-phase commit at its range leader, mean ms:" + stageMeans(before, after))
}

// stageMeans formats, for each stage one-phase commits passed through
// between two samples of runCost.stages, its mean in ms and (in
// parentheses) how many commits did: " locks 0.12 (2301), epochs ...";
// empty if none did.
func stageMeans(before, after map[string]stageTime) string {
	var line string
	for _, stage := range []string{"locks", "epochs", "replicate"} {
		if n := after[stage].count - before[stage].count; n > 0 {
			line += fmt.Sprintf(" %s %.2f (%.0f),", stage, 1e3*(after[stage].seconds-before[stage].seconds)/n, n)
		}
	}
	return strings.TrimSuffix(line, ",")
}

// printEpochReads prints where the nodes' epoch reads spent their time
// between two samples: waiting for their round to begin, and in it (a
// commit's epochs stage is about the two, plus its wake-up).
func printEpochReads(before, after runCost) {
	if r, ok := epochReadsBetween(before, after); ok {
		fmt.Printf("per epoch read (the nodes' readers: %.0f reads in %.0f rounds, %.2f per round): waited %.2f ms for its round to begin; a round took %.2f ms to decide\n",
			r.reads, r.rounds, r.reads/r.rounds, r.waitMS, r.roundMS)
	}
}

// epochReads is what the nodes' epoch readers did between two samples of
// runCost: reads answered, rounds run, the mean ms a read waited for its
// round to begin and the mean ms a round took to decide.
type epochReads struct {
	reads, rounds, waitMS, roundMS float64
}

// epochReadsBetween returns the nodes' epoch reads between before and
// after; ok is false when there were none.
func epochReadsBetween(before, after runCost) (r epochReads, ok bool) {
	r.reads, r.rounds = after.epochReads-before.epochReads, after.epochRounds-before.epochRounds
	if r.reads <= 0 || r.rounds <= 0 {
		return epochReads{}, false
	}
	r.waitMS = 1e3 * (after.epochWaited - before.epochWaited) / r.reads
	r.roundMS = 1e3 * (after.epochInRounds - before.epochInRounds) / r.rounds
	return r, true
}

// printReadys prints the mean time the nodes' Raft Readys spent making
// their appends durable and applying committed entries between two
// samples: what a group's goroutine is busy with while proposals and
// messages wait for it.
func printReadys(before, after runCost) {
	if s := readysBetween(before, after); s != "" {
		fmt.Printf("per Raft Ready (every replica's), mean ms: %s\n", s)
	}
}

// readysBetween says how long, in mean ms, the nodes' Raft Readys between
// two samples took to make their appends durable and to apply committed
// entries, with how many of each ("" if either is none).
func readysBetween(before, after runCost) string {
	syncs, applies := after.syncs-before.syncs, after.applies-before.applies
	if syncs <= 0 || applies <= 0 {
		return ""
	}
	return fmt.Sprintf("durable append %.3f (%.0f), apply %.3f (%.0f)",
		1e3*(after.syncSecs-before.syncSecs)/syncs, syncs, 1e3*(after.applySecs-before.applySecs)/applies, applies)
}

// printRPCsByMethod prints the six busiest RPC methods between two samples
// of runCost.byMethod, in calls per operation over ops operations.
func printRPCsByMethod(before, after map[string]float64, ops int64) {
	line := "per operation, RPCs served by method:"
	for _, r := range busiest(before, after, float64(ops), 6) {
		line += fmt.Sprintf(" %s %.2f,", r.method, r.n)
	}
	fmt.Println(strings.TrimSuffix(line, ","))
}

// methodCount is one RPC method's calls between two samples, divided by
// what busiest was given (operations, seconds).
type methodCount struct {
	method string
	n      float64
}

// busiest returns the top RPC methods by calls between two samples of
// runCost.byMethod, each divided by per, busiest first.
func busiest(before, after map[string]float64, per float64, top int) []methodCount {
	var out []methodCount
	for m, n := range after {
		if d := n - before[m]; d > 0 {
			out = append(out, methodCount{m, d / per})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n > out[j].n })
	return out[:min(top, len(out))]
}

// printLeaders prints which node leads each of the embedded cluster's
// groups at the end of a run: where the commit path's stages ran (the
// range leader, the local epoch's leader, whose replicas an epoch read
// asks), which varies from run to run and with it the figures.
func printLeaders(c *localcluster.Cluster) {
	line := "leaders at the end:"
	for _, g := range c.Topology.Groups {
		line += fmt.Sprintf(" %s %d on node %d,", g.Kind, g.ID, c.Leader(g.ID))
	}
	fmt.Println(strings.TrimSuffix(line, ","))
}
