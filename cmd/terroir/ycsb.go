package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/etcdpeer"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/ycsb"
)

func benchYCSBCmd() *cobra.Command {
	var f benchFlags
	var conn connFlags
	var workload, distribution, clusterPath, region, out, target, targetPids, clusterPids string
	var versus, withFloor bool
	var every time.Duration
	var records, operations, clients, fieldCount, fieldLength, pairs int
	var seed uint64
	cmd := &cobra.Command{
		Use:   "ycsb",
		Short: "YCSB core workloads A–F on the embedded cluster or a running one",
		Long: `ycsb loads --records records (--field-count fields of --field-length bytes,
stored as one value), then runs core workload --workload (a–f, as YCSB defines
them: a 50/50 read/update, b 95/5 read/update, c read only, d 95/5 read/insert
on the latest records, e 95/5 scan/insert, f 50/50 read/read-modify-write)
from --clients concurrent clients, each operation one transaction, for
--operations operations or, if 0, for --duration. Keys are homed in the
client's region, so every transaction is single-region.

It runs against the embedded cluster of --config (default: examples/one-region.yaml
in this process) or, with --cluster, against a running cluster of that topology.
It prints P50/P95/P99 per operation and the throughput, beside this machine's
floor measured in the same run (--floor=false skips that), and with --out writes ycsb-<workload>.json and
.md there. On the embedded cluster it also prints what an operation cost: the
process's CPU time, RPCs, Raft proposals and log syncs, the bytes the stores
wrote (WAL, flushes, compactions), the write requests the data directory's
disk served (every process's, per operation and per second) and how long
the stores' writes stalled; with --every, each window prints its own CPU,
disk writes and stalls. Each window also prints the share of the
machine's CPU the hypervisor took and the CPU time a fixed hash took (how
fast the machine's CPUs ran that window), and the summary compares the
last windows with the first per CPU left and at that speed.

With --target-pids (the etcd members' processes) and --cluster-pids (the
running cluster's node processes), it also prints each system's CPU time per
operation of the run phase (user + system, summed over its processes, from
/proc/<pid>/stat) and the driver's (this process's) own.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if targetPids != "" && target == "" {
				return errors.New("--target-pids needs --target (they are the target's processes)")
			}
			if clusterPids != "" && clusterPath == "" {
				return errors.New("--cluster-pids needs --cluster (they are the running cluster's node processes)")
			}
			etcdProcs, err := parsePids("target-pids", targetPids)
			if err != nil {
				return err
			}
			terroirProcs, err := parsePids("cluster-pids", clusterPids)
			if err != nil {
				return err
			}
			w, err := ycsb.Core(workload)
			if err != nil {
				return err
			}
			w.RecordCount, w.OperationCount, w.FieldCount, w.FieldLength = records, operations, fieldCount, fieldLength
			if distribution != "" {
				w.Distribution = ycsb.Distribution(distribution)
			}
			// Proportions given on the command line replace the workload's.
			for name, p := range map[string]*float64{"read-proportion": &w.Read, "update-proportion": &w.Update,
				"insert-proportion": &w.Insert, "scan-proportion": &w.Scan, "rmw-proportion": &w.ReadModifyWrite} {
				if cmd.Flags().Changed(name) {
					*p, _ = cmd.Flags().GetFloat64(name)
				}
			}
			if cmd.Flags().Changed("max-scan-length") {
				w.MaxScanLength, _ = cmd.Flags().GetInt("max-scan-length")
			}
			if every < 0 {
				return fmt.Errorf("--every %v: must not be negative", every)
			}
			if err := checkPairs(pairs, target != "" && versus, operations, every); err != nil {
				return err
			}
			if err := w.Validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			cfg := ycsb.Config{Workload: w, Clients: clients, Duration: f.duration, Seed: seed}
			var results []*ycsb.Result
			var costs []*cpuPerOp
			var names []string
			if target != "" {
				endpoints, err := etcdpeer.ParseTarget(target)
				if err != nil {
					return err
				}
				store, err := etcdpeer.Open(ctx, endpoints)
				if err != nil {
					return err
				}
				defer store.Close()
				cfg.Keys = ycsb.KeySpace{Prefixes: [][]byte{[]byte("y-")}}
				if pairs > 1 {
					return runVersusInPairs(ctx, &f, &conn, clusterPath, region, pairs, pairSide{name: "etcd", store: store, keys: cfg.Keys, pids: etcdProcs}, terroirProcs, cfg, out, withFloor)
				}
				res, cost, err := runYCSB(ctx, "etcd at "+strings.Join(endpoints, ","), store, cfg, nil, nil, etcdProcs, every)
				if err != nil {
					return err
				}
				results, costs, names = append(results, res), append(costs, cost), append(names, "etcd")
			}
			if target == "" || versus {
				res, cost, err := runTerroirYCSB(ctx, &f, &conn, clusterPath, region, cfg, terroirProcs, every, withFloor)
				if err != nil {
					return err
				}
				results, costs, names = append(results, res), append(costs, cost), append(names, "terroir")
			}
			return report(results, costs, names, out)
		},
	}
	f.register(cmd)
	cmd.Flags().Lookup("duration").DefValue = "10s"
	_ = cmd.Flags().Set("duration", "10s")
	cmd.Flags().StringVar(&workload, "workload", "a", "YCSB core workload: a, b, c, d, e or f")
	cmd.Flags().StringVar(&distribution, "distribution", "", "request distribution: uniform, zipfian or latest (default: the workload's)")
	cmd.Flags().IntVar(&records, "records", 10000, "recordcount: records loaded before the run")
	cmd.Flags().IntVar(&operations, "operations", 0, "operationcount: operations to run (0: run for --duration)")
	cmd.Flags().IntVar(&fieldCount, "field-count", 10, "fieldcount: fields per record")
	cmd.Flags().Float64("read-proportion", 0, "readproportion (default: the workload's)")
	cmd.Flags().Float64("update-proportion", 0, "updateproportion (default: the workload's)")
	cmd.Flags().Float64("insert-proportion", 0, "insertproportion (default: the workload's)")
	cmd.Flags().Float64("scan-proportion", 0, "scanproportion (default: the workload's)")
	cmd.Flags().Float64("rmw-proportion", 0, "readmodifywriteproportion (default: the workload's)")
	cmd.Flags().Int("max-scan-length", 100, "maxscanlength: a scan reads 1 to this many records")
	cmd.Flags().IntVar(&fieldLength, "field-length", 100, "fieldlength: bytes per field")
	cmd.Flags().IntVar(&clients, "clients", 16, "concurrent client threads")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed for the records and the operation sequence")
	cmd.Flags().StringVar(&conn.certsDir, "certs-dir", "certs", "with --cluster: directory of ca.crt and the user's client certificate")
	cmd.Flags().StringVar(&conn.user, "user", security.AdminUser, "with --cluster: whose client certificate to present")
	cmd.Flags().StringVar(&clusterPath, "cluster", "", "topology file of a running cluster to benchmark instead of the embedded one")
	cmd.Flags().StringVar(&region, "region", "", "the clients' region (default: the first)")
	cmd.Flags().StringVar(&out, "out", "", "directory to write <target>-ycsb-<workload>.json and .md to")
	cmd.Flags().StringVar(&target, "target", "", "run against etcd instead: etcd://host:port[,host:port...]")
	cmd.Flags().DurationVar(&every, "every", 0, "also print the throughput and P50/P99 of every window of this length, and the last window against the second (steady state; 0: off)")
	cmd.Flags().BoolVar(&withFloor, "floor", true, "on the embedded cluster, after the run: measure the machine's floor and one client's transactions against it (about 8 s; false skips it, for a quick run of a workload)")
	cmd.Flags().IntVar(&pairs, "pairs", 1, "with --target and --versus-terroir: run each system for --duration in this many alternating slices (etcd, Terroir, etcd, ...), so both see the same minutes of the machine, and print each pair's throughput ratio")
	cmd.Flags().BoolVar(&versus, "versus-terroir", false, "with --target: also run the same workload on Terroir (the embedded cluster, or --cluster) and print both side by side")
	cmd.Flags().StringVar(&targetPids, "target-pids", "", "with --target: comma-separated pids of the target's server processes, to print their CPU time per operation")
	cmd.Flags().StringVar(&clusterPids, "cluster-pids", "", "with --cluster: comma-separated pids of the cluster's node processes, to print their CPU time per operation")
	cmd.Flags().Lookup("insecure").Usage = "plaintext, no TLS: the embedded cluster, or connect to a --cluster started with --insecure"
	return cmd
}

// report prints each run's table and CPU cost, the two side by side when
// there are two, and writes them into out (""; none).
func report(results []*ycsb.Result, costs []*cpuPerOp, names []string, out string) error {
	for i, res := range results {
		fmt.Println()
		fmt.Print(res.Markdown(fmt.Sprintf("YCSB workload %s on %s", res.Workload.Name, names[i])))
		if costs[i] != nil {
			fmt.Printf("%s: %s\n", names[i], costs[i])
		}
	}
	if len(results) == 2 {
		fmt.Println()
		fmt.Print(ycsb.SideBySide(names[0], results[0], names[1], results[1]))
		fmt.Println(ratios(names[0], results[0], costs[0], names[1], results[1], costs[1]))
	}
	if out != "" {
		for i, res := range results {
			if err := writeYCSB(out, names[i], res); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkPairs refuses a --pairs the run cannot honour: below 1, above 1
// without both systems (versus: --target with --versus-terroir), or with
// a run bounded by operations or cut into --every windows.
func checkPairs(pairs int, versus bool, operations int, every time.Duration) error {
	switch {
	case pairs < 1:
		return fmt.Errorf("--pairs %d: must be at least 1", pairs)
	case pairs == 1:
		return nil
	case !versus:
		return fmt.Errorf("--pairs %d needs --target and --versus-terroir: it alternates the two systems", pairs)
	case operations > 0:
		return fmt.Errorf("--pairs %d splits --duration: not with --operations", pairs)
	case every > 0:
		return fmt.Errorf("--pairs %d: not with --every (its windows would span the other system's slices)", pairs)
	}
	return nil
}

// runVersusInPairs runs cfg on etcd and on Terroir (a running cluster of
// clusterPath whose node processes are terroirPids, or the embedded one
// of f) in pairs alternating slices (runPairs), then reports them as
// report does; on the embedded cluster, with withFloor, it then measures
// the floor and one client's transactions.
func runVersusInPairs(ctx context.Context, f *benchFlags, conn *connFlags, clusterPath, region string, pairs int, etcd pairSide, terroirPids []int, cfg ycsb.Config, out string, withFloor bool) error {
	t, err := openTerroir(ctx, f, conn, clusterPath, region)
	if err != nil {
		return err
	}
	defer t.close()
	keys, err := t.keys()
	if err != nil {
		return err
	}
	ter := pairSide{name: "terroir", store: ycsb.Terroir(t.db), keys: keys, pids: terroirPids, remote: t.remote}
	res, costs, err := runPairs(ctx, pairs, [2]pairSide{etcd, ter}, cfg)
	if err != nil {
		return err
	}
	if err := report(res[:], costs[:], []string{etcd.name, ter.name}, out); err != nil {
		return err
	}
	if t.c != nil && withFloor {
		cfg.Keys = keys
		return t.floorAndOneClient(ctx, cfg)
	}
	return nil
}

// runYCSB loads store and runs cfg on it. With c (the embedded cluster
// store belongs to) it prints what an operation of the run cost. With pids
// (the processes serving store) it returns the CPU time an operation of the
// run phase cost in them and in this process; else that is nil.
func runYCSB(ctx context.Context, name string, store ycsb.Store, cfg ycsb.Config, c *localcluster.Cluster, remote []string, pids []int, every time.Duration) (*ycsb.Result, *cpuPerOp, error) {
	w := cfg.Workload
	fmt.Printf("%s: loading %d records of %d × %d B...\n", name, w.RecordCount, w.FieldCount, w.FieldLength)
	if err := ycsb.Load(ctx, store, w, cfg.Keys, cfg.Seed); err != nil {
		return nil, nil, err
	}
	fmt.Printf("%s: running workload %s for %s...\n", name, w.Name, runLength(w, cfg.Duration))
	var cost runCost
	if c != nil {
		cost = sampleCost(c)
	}
	var remoteBefore remoteSample
	if len(remote) > 0 {
		remoteBefore = sampleRemote(ctx, remote)
	}
	var before cpuSample
	var err error
	if len(pids) > 0 {
		if before, err = sampleCPU(pids); err != nil {
			return nil, nil, err
		}
	}
	var stopWindows func()
	if every > 0 {
		var sample func() runCost
		if c != nil {
			sample = func() runCost { return sampleCost(c) }
		}
		win, done, stopped := newWindows(name, every, sample), make(chan struct{}), make(chan struct{})
		cfg.Observe = win.observe
		go func() { defer close(stopped); win.run(done) }()
		stopWindows = func() { close(done); <-stopped }
	}
	res, err := ycsb.Run(ctx, store, cfg)
	if stopWindows != nil {
		stopWindows()
	}
	if err != nil {
		return nil, nil, err
	}
	var perOpCPU *cpuPerOp
	if len(pids) > 0 {
		after, err := sampleCPU(pids)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: after the run: %w", name, err)
		}
		per := perOp(before, after, len(pids), res.Ops())
		perOpCPU = &per
	}
	if c != nil {
		printCost(cost, sampleCost(c), res.Ops())
		printLeaders(c)
	}
	if len(remote) > 0 {
		printRemote(remoteBefore, sampleRemote(ctx, remote), res.Ops())
	}
	return res, perOpCPU, nil
}

// ratios is the line under the side-by-side table: b's throughput and, when
// both were measured, b's CPU time per operation in its servers' processes,
// each as a multiple of a's.
func ratios(nameA string, a *ycsb.Result, costA *cpuPerOp, nameB string, b *ycsb.Result, costB *cpuPerOp) string {
	line := fmt.Sprintf("%s/%s: throughput %.2f×", nameB, nameA, b.Throughput()/a.Throughput())
	if costA != nil && costB != nil && costA.servers > 0 {
		line += fmt.Sprintf(", CPU per operation %.2f× (servers' processes: %s vs %s)",
			float64(costB.servers)/float64(costA.servers), micros(costB.servers), micros(costA.servers))
	}
	return line
}

func runLength(w ycsb.Workload, d time.Duration) string {
	if w.OperationCount > 0 {
		return fmt.Sprintf("%d operations", w.OperationCount)
	}
	return d.String()
}

// terroirTarget is the Terroir cluster a YCSB run drives: a running one
// (c nil; remote its nodes' HTTP addresses, where they are the default) or
// the embedded one (c), and the client's region.
type terroirTarget struct {
	db      *client.DB
	c       *localcluster.Cluster
	top     *topology.Topology
	region  string
	remote  []string
	closers []func()
}

// openTerroir connects to the running cluster of clusterPath, or starts
// the embedded one of f, and opens a client in region (the first: "").
// Errors: the connection's, the cluster's start, the client's.
func openTerroir(ctx context.Context, f *benchFlags, conn *connFlags, clusterPath, region string) (*terroirTarget, error) {
	t := &terroirTarget{}
	if clusterPath != "" {
		conn.insecure = f.insecure
		cn, err := conn.connect(ctx, clusterPath, region)
		if err != nil {
			return nil, err
		}
		t.closers = append(t.closers, cn.Close)
		db, err := cn.client()
		if err != nil {
			t.close()
			return nil, err
		}
		t.db, t.top, t.region = db, cn.top, cn.region
		t.closers = append(t.closers, func() { _ = db.Close() })
		for _, n := range t.top.Nodes {
			if a, err := defaultHTTPAddr(n.Addr); err == nil {
				t.remote = append(t.remote, a)
			}
		}
		return t, nil
	}
	c, group, err := f.startBench()
	if err != nil {
		return nil, err
	}
	t.c, t.top, t.region = c, c.Topology, group.Region
	t.closers = append(t.closers, func() { _ = c.Close() })
	if t.db, err = c.Client(t.region); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// close closes what openTerroir opened, the last first.
func (t *terroirTarget) close() {
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i]()
	}
}

// name is the target as a run's lines name it.
func (t *terroirTarget) name() string { return "terroir in " + t.region }

// keys is the key space homed in the target's region.
func (t *terroirTarget) keys() (ycsb.KeySpace, error) { return ycsb.RegionKeys(t.top, t.region) }

// runTerroirYCSB runs cfg on a running cluster (clusterPath, whose node
// processes are pids) or the embedded one of f, with keys homed in the
// clients' region, and, with withFloor, prints the machine's floor and one
// client's transactions against it for the embedded one.
func runTerroirYCSB(ctx context.Context, f *benchFlags, conn *connFlags, clusterPath, region string, cfg ycsb.Config, pids []int, every time.Duration, withFloor bool) (*ycsb.Result, *cpuPerOp, error) {
	t, err := openTerroir(ctx, f, conn, clusterPath, region)
	if err != nil {
		return nil, nil, err
	}
	defer t.close()
	if cfg.Keys, err = t.keys(); err != nil {
		return nil, nil, err
	}
	res, cost, err := runYCSB(ctx, t.name(), ycsb.Terroir(t.db), cfg, t.c, t.remote, pids, every)
	if err != nil || t.c == nil || !withFloor {
		return res, cost, err
	}
	if err := t.floorAndOneClient(ctx, cfg); err != nil {
		return nil, nil, err
	}
	return res, cost, nil
}

// floorAndOneClient measures the embedded cluster's floor, then one
// client's transactions against it, on the same cluster after the run
// (issue 17).
func (t *terroirTarget) floorAndOneClient(ctx context.Context, cfg ycsb.Config) error {
	group := t.top.GroupsOfKind(topology.KindLocalEpoch, t.region)[0]
	probe, err := newFloorProbe(t.c, group)
	if err != nil {
		return err
	}
	fl, err := measureFloor(t.c, probe, time.Second)
	if err != nil {
		return err
	}
	printFloor(fl)
	records := max(cfg.Workload.RecordCount, 1)
	return singleClient(ctx, t.c, t.db, func(i int) []byte { return cfg.Keys.Key(uint64(i % records)) }, probe, fl, time.Second)
}

// writeYCSB writes res as JSON and Markdown into dir, named after the target.
func writeYCSB(dir, name string, res *ycsb.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := res.JSON()
	if err != nil {
		return err
	}
	base := filepath.Join(dir, name+"-ycsb-"+res.Workload.Name)
	return errors.Join(os.WriteFile(base+".json", js, 0o644),
		os.WriteFile(base+".md", []byte(res.Markdown("YCSB workload "+res.Workload.Name+" on "+name)), 0o644))
}
