package main

import (
	"fmt"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/terroir-db/terroir/internal/localcluster"
)

// runCost is what the embedded cluster and its driver had spent at one
// moment: the process's CPU time and the nodes' counters of the commands
// that make up a transaction (issue 17: a benchmark that explains itself).
type runCost struct {
	cpu                    time.Duration
	rpcs, proposals, syncs float64
	// wal, flushed and compacted are the bytes the nodes' stores wrote to
	// disk: to the WAL, by memtable flushes and by compactions.
	wal, flushed, compacted float64
	// stalled is the seconds the stores held back all writes (summed
	// over the nodes).
	stalled float64
}

// sampleCost reads the process's CPU time (user + system) and, summed over
// c's running nodes, the RPCs they served (terroir_rpc_server_seconds),
// the Raft entries proposed (terroir_raft_proposals_total), the Raft
// log appends synced to disk (terroir_raft_append_sync_seconds) and the
// bytes their stores wrote (terroir_pebble_{wal_written,flushed,compacted}_bytes_total)
// and the time their writes stalled (terroir_pebble_write_stall_seconds_total).
func sampleCost(c *localcluster.Cluster) runCost {
	var out runCost
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	counted := map[string]*float64{
		"terroir_rpc_server_seconds":               &out.rpcs,
		"terroir_raft_proposals_total":             &out.proposals,
		"terroir_raft_append_sync_seconds":         &out.syncs,
		"terroir_pebble_wal_written_bytes_total":   &out.wal,
		"terroir_pebble_flushed_bytes_total":       &out.flushed,
		"terroir_pebble_compacted_bytes_total":     &out.compacted,
		"terroir_pebble_write_stall_seconds_total": &out.stalled,
	}
	eachFamily(c, func(mf *dto.MetricFamily) {
		if sum, ok := counted[mf.GetName()]; ok {
			*sum += sumMetric(mf)
		}
	})
	return out
}

// eachFamily calls fn with every metric family of each of c's running
// nodes (nodes whose metrics cannot be gathered are skipped).
func eachFamily(c *localcluster.Cluster, fn func(*dto.MetricFamily)) {
	for _, id := range c.NodeIDs() {
		n := c.Node(id)
		if n == nil {
			continue
		}
		mfs, err := n.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			fn(mf)
		}
	}
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

// printCost prints what one operation cost between two samples over ops
// operations.
func printCost(before, after runCost, ops int64) {
	if ops <= 0 {
		return
	}
	per := func(a, b float64) float64 { return (b - a) / float64(ops) }
	fmt.Printf("per operation: CPU %.0f µs (the whole process: the cluster's nodes and the driver), RPCs served %.2f, Raft proposals %.2f, log syncs %.2f (every replica's)\n",
		float64(after.cpu-before.cpu)/float64(time.Microsecond)/float64(ops), per(before.rpcs, after.rpcs), per(before.proposals, after.proposals), per(before.syncs, after.syncs))
	fmt.Printf("per operation: disk writes %s (every store's); writes stalled %s in all\n", diskPerOp(before, after, ops), stalledFor(before, after))
}

// diskPerOp is the bytes the stores wrote per operation between two
// samples, in KiB: in all, and to the WAL, by flushes and by compactions.
func diskPerOp(before, after runCost, ops int64) string {
	kib := func(a, b float64) float64 { return (b - a) / 1024 / float64(ops) }
	wal, fl, co := kib(before.wal, after.wal), kib(before.flushed, after.flushed), kib(before.compacted, after.compacted)
	return fmt.Sprintf("%.1f KiB (WAL %.1f, flushes %.1f, compactions %.1f)", wal+fl+co, wal, fl, co)
}

// stalledFor is how long the stores' writes stalled between two samples,
// summed over the nodes.
func stalledFor(before, after runCost) time.Duration {
	return time.Duration((after.stalled - before.stalled) * float64(time.Second)).Round(time.Millisecond)
}
