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
}

// sampleCost reads the process's CPU time (user + system) and, summed over
// c's running nodes, the RPCs they served (terroir_rpc_server_seconds),
// the Raft entries proposed (terroir_raft_proposals_total) and the Raft
// log appends synced to disk (terroir_raft_append_sync_seconds).
func sampleCost(c *localcluster.Cluster) runCost {
	var out runCost
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	eachFamily(c, func(mf *dto.MetricFamily) {
		switch mf.GetName() {
		case "terroir_rpc_server_seconds":
			out.rpcs += sumMetric(mf)
		case "terroir_raft_proposals_total":
			out.proposals += sumMetric(mf)
		case "terroir_raft_append_sync_seconds":
			out.syncs += sumMetric(mf)
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
}
