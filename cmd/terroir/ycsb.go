package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/experiment"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/ycsb"
)

func benchYCSBCmd() *cobra.Command {
	var f benchFlags
	var workload, distribution, clusterPath, region, out string
	var records, operations, clients, fieldCount, fieldLength int
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
floor measured in the same run, and with --out writes ycsb-<workload>.json and
.md there.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w, err := ycsb.Core(workload)
			if err != nil {
				return err
			}
			w.RecordCount, w.OperationCount, w.FieldCount, w.FieldLength = records, operations, fieldCount, fieldLength
			if distribution != "" {
				w.Distribution = ycsb.Distribution(distribution)
			}
			if err := w.Validate(); err != nil {
				return err
			}
			var db *client.DB
			var top *topology.Topology
			var c *localcluster.Cluster
			if clusterPath != "" {
				if top, err = topology.Load(clusterPath); err != nil {
					return err
				}
				if db, err = client.Open(clusterPath, client.Options{Region: region}); err != nil {
					return err
				}
				defer db.Close()
				if region == "" {
					region = top.Regions[0]
				}
			} else {
				var group topology.Group
				if c, group, err = f.startBench(); err != nil {
					return err
				}
				defer c.Close()
				top, region = c.Topology, group.Region
				if db, err = c.Client(region); err != nil {
					return err
				}
			}
			keys, err := ycsb.RegionKeys(top, region)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			fmt.Printf("loading %d records of %d × %d B in %s...\n", w.RecordCount, w.FieldCount, w.FieldLength, region)
			if err := ycsb.Load(ctx, db, w, keys, seed); err != nil {
				return err
			}
			res, err := ycsb.Run(ctx, db, ycsb.Config{Workload: w, Keys: keys, Clients: clients, Duration: f.duration, Seed: seed})
			if err != nil {
				return err
			}
			fmt.Println()
			fmt.Print(res.Markdown("YCSB workload " + w.Name))
			if c != nil {
				group := top.GroupsOfKind(topology.KindLocalEpoch, region)[0]
				rtt, err := experiment.MeasurePing(c, group, time.Second)
				if err != nil {
					return err
				}
				fsync, err := experiment.MeasureFsync(c.DataDir(), time.Second)
				if err != nil {
					return err
				}
				fmt.Printf("\nfloor on this machine: loopback gRPC round trip P50 %s, fsync (4 KiB) P50 %s\n",
					latency.MS(rtt.Quantile(50)), latency.MS(fsync.Quantile(50)))
			}
			if out != "" {
				return writeYCSB(out, res)
			}
			return nil
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
	cmd.Flags().IntVar(&fieldLength, "field-length", 100, "fieldlength: bytes per field")
	cmd.Flags().IntVar(&clients, "clients", 16, "concurrent client threads")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed for the records and the operation sequence")
	cmd.Flags().StringVar(&clusterPath, "cluster", "", "topology file of a running cluster to benchmark instead of the embedded one")
	cmd.Flags().StringVar(&region, "region", "", "the clients' region (default: the first)")
	cmd.Flags().StringVar(&out, "out", "", "directory to write ycsb-<workload>.json and .md to")
	return cmd
}

// writeYCSB writes res as JSON and Markdown into dir.
func writeYCSB(dir string, res *ycsb.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := res.JSON()
	if err != nil {
		return err
	}
	base := filepath.Join(dir, "ycsb-"+res.Workload.Name)
	return errors.Join(os.WriteFile(base+".json", js, 0o644),
		os.WriteFile(base+".md", []byte(res.Markdown("YCSB workload "+res.Workload.Name)), 0o644))
}
