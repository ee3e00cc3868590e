package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/experiment"
	"github.com/terroir-db/terroir/internal/topology"
)

// loadTopology loads path, or the embedded examples/one-region.yaml if path is "".
func loadTopology(path string) (*topology.Topology, error) {
	if path == "" {
		return topology.Parse(examples.OneRegion)
	}
	return topology.Load(path)
}

// experimentFlags are the flags of the paper's §6.2 run, shared by demo and
// bench paper.
type experimentFlags struct {
	configPath      string
	cfg             experiment.Config
	defaultDuration time.Duration
}

func (f *experimentFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.configPath, "config", "", "topology file (default: the embedded examples/three-regions.yaml)")
	cmd.Flags().DurationVar(&f.cfg.Duration, "duration", f.defaultDuration, "how long the measured run lasts, after loading")
	cmd.Flags().IntVar(&f.cfg.Records, "records", 1000, "YCSB records (1 KiB) per data region")
	cmd.Flags().IntVar(&f.cfg.Threads, "threads", 5, "YCSB client threads per data region (the paper: 5)")
	cmd.Flags().Uint64Var(&f.cfg.Seed, "seed", 1, "random seed: the same seed runs the same records and operation sequence")
	cmd.Flags().BoolVar(&f.cfg.Keep, "keep", false, "keep the cluster's data directory")
}

// config returns the run's configuration with its topology loaded.
func (f *experimentFlags) config() (experiment.Config, error) {
	cfg := f.cfg
	var err error
	if f.configPath == "" {
		cfg.Topology, err = topology.Parse(examples.ThreeRegions)
	} else {
		cfg.Topology, err = topology.Load(f.configPath)
	}
	return cfg, err
}

func demoCmd() *cobra.Command {
	f := experimentFlags{defaultDuration: time.Minute}
	var out string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the paper's evaluation on a three-region cluster inside this process, with a live view and a report",
		Long: `demo starts the three-region cluster of examples/three-regions.yaml inside
this process — real Raft groups, real fsync'd Pebble stores in a temporary
directory (removed unless --keep), real gRPC on 127.0.0.1, the WAN's round trips
injected between regions (us-east1 ↔ us-west1 63 ms, ↔ us-central1 31 and 37 ms).
It loads a YCSB table in each data region, then runs the paper's §6.2
experiment for --duration: YCSB-A in us-east1 and us-west1 from clients in
each region, and a snapshot from us-west1 reading one key per region every
100 ms, strong (the paper's mode) and strong-local (the same guarantee
without the call to the global epoch service) by turns. A progress bar and a
status line show throughput, the global and local epochs and latencies as it
runs. At the end it prints the measured figures beside the paper's and writes
a Markdown report with latency CDF plots (PNG) into --out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config()
			if err != nil {
				return err
			}
			top := cfg.Topology
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "Starting %d nodes in %s; data in %s; loading %d records per region...\n",
				len(top.Nodes), strings.Join(top.Regions, ", "), strings.Join(experiment.DataRegions(top), " and "), f.cfg.Records)
			cfg.Started = func(url string) {
				fmt.Fprintf(w, "Web console (mutual TLS between the nodes; any node serves one): %s\n", url)
			}
			live := newLiveView(w)
			res, err := experiment.Run(ctx, cfg, live.show)
			live.done()
			if err != nil {
				return err
			}
			fmt.Fprintln(w)
			res.WriteTable(w)
			report, err := res.WriteReport(out)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "\nReport with latency CDFs: %s\n", report)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&out, "out", "terroir-demo", "directory for the report (report.md, results.json, cdf-*.png)")
	return cmd
}

// liveView draws the demo's progress: on a terminal, a progress bar and a
// status line redrawn in place; otherwise one line every 5 s.
type liveView struct {
	w        interface{ Write([]byte) (int, error) }
	terminal bool
	last     time.Time
}

func newLiveView(w interface{ Write([]byte) (int, error) }) *liveView {
	v := &liveView{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			v.terminal = true
		}
	}
	return v
}

func (v *liveView) show(p experiment.Progress) {
	const width = 24
	done := min(int(float64(width)*p.Elapsed.Seconds()/p.Duration.Seconds()), width)
	bar := "[" + strings.Repeat("#", done) + strings.Repeat(".", width-done) + "]"
	locals := make([]string, len(p.LocalEpochs))
	for i, e := range p.LocalEpochs {
		locals[i] = fmt.Sprint(e)
	}
	line := fmt.Sprintf("%s %3.0fs/%.0fs  %5.0f txn/s  global epoch %d  local %s  read %s  write %s  snapshot %s",
		bar, p.Elapsed.Seconds(), p.Duration.Seconds(), p.TxnsPerSec, p.GlobalEpoch, strings.Join(locals, "/"),
		short(p.ReadP50), short(p.WriteP50), short(p.SnapshotP50))
	if v.terminal {
		fmt.Fprintf(v.w, "\r\033[K%s", line)
		return
	}
	if time.Since(v.last) >= 5*time.Second {
		v.last = time.Now()
		fmt.Fprintln(v.w, line)
	}
}

func (v *liveView) done() {
	if v.terminal {
		fmt.Fprintln(v.w)
	}
}

// short formats a P50 for the status line ("-" when nothing completed).
func short(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
