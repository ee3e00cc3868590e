package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/experiment"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/topology"
)

func benchCmd() *cobra.Command {
	var cpuProfile, traceFile string
	var profileAfter, traceAfter time.Duration
	var profs []*delayedProfile
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks on an embedded cluster; figures are P50/P99 from HDR histograms",
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := cmd.Root().PersistentPreRunE(cmd, args); err != nil {
				return err
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				profs = append(profs, startProfileAfter(f, profileAfter, pprof.StartCPUProfile, pprof.StopCPUProfile))
			}
			if traceFile != "" {
				f, err := os.Create(traceFile)
				if err != nil {
					return err
				}
				profs = append(profs, startProfileAfter(f, traceAfter, trace.Start, trace.Stop))
			}
			return nil
		},
		PersistentPostRun: func(*cobra.Command, []string) {
			for _, p := range profs {
				p.stop()
			}
		},
	}
	cmd.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	cmd.PersistentFlags().DurationVar(&profileAfter, "cpuprofile-after", 0, "start the CPU profile this long after the benchmark starts, e.g. 15m: a long run's later minutes alone (with --cpuprofile)")
	cmd.PersistentFlags().StringVar(&traceFile, "trace", "", "write a Go execution trace of the run to this file (go tool trace; -pprof=sched gives where goroutines waited to run)")
	cmd.PersistentFlags().DurationVar(&traceAfter, "trace-after", 0, "start the execution trace this long after the benchmark starts (with --trace)")
	cmd.AddCommand(benchRaftCmd(), benchEpochCmd(), benchYCSBCmd(), benchPaperCmd(), benchCompareCmd(), benchSplitCmd(), benchRebalanceCmd(), benchSnapshotCmd(), benchGCCmd(), benchTLSCmd(), benchGeoCmd(), benchIdleCmd())
	return cmd
}

// benchFlags are shared by every benchmark.
type benchFlags struct {
	config   string
	duration time.Duration
	insecure bool
}

func (f *benchFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.config, "config", "", "topology file (default: the embedded examples/one-region.yaml)")
	cmd.Flags().DurationVar(&f.duration, "duration", 3*time.Second, "how long each measurement runs")
	cmd.Flags().BoolVar(&f.insecure, "insecure", false, "run the embedded cluster without TLS (default: mutual TLS, as a deployment runs)")
}

// startBench starts the embedded cluster and waits for the first epoch group's leader.
func (f *benchFlags) startBench() (*localcluster.Cluster, topology.Group, error) {
	top, err := loadTopology(f.config)
	if err != nil {
		return nil, topology.Group{}, err
	}
	groups := top.GroupsOfKind(topology.KindLocalEpoch, "")
	if len(groups) == 0 {
		return nil, topology.Group{}, errors.New("the topology has no local epoch group")
	}
	c, err := localcluster.Start(top, localcluster.Options{Insecure: f.insecure})
	if err != nil {
		return nil, topology.Group{}, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Leader(groups[0].ID) == 0 {
		if time.Now().After(deadline) {
			c.Close()
			return nil, topology.Group{}, errors.New("no epoch leader elected within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c, groups[0], nil
}

// runFor calls op from `workers` goroutines for d, recording each successful
// call's latency; it returns the histogram and the failures.
func runFor(d time.Duration, workers int, op func(ctx context.Context) error) (*latency.Histogram, int) {
	h := latency.New()
	var wg sync.WaitGroup
	var mu sync.Mutex
	fails := 0
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := timedFor(h, op, d)
			mu.Lock()
			fails += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return h, fails
}

// timedFor runs op from one caller for d, each call within 5 s, records
// the latency of each that succeeds in h, and returns how many failed.
func timedFor(h *latency.Histogram, op func(ctx context.Context) error, d time.Duration) (fails int) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err := op(ctx)
		cancel()
		if err != nil {
			fails++
			continue
		}
		h.Since(start)
	}
	return fails
}

func printRow(name string, h *latency.Histogram, d time.Duration, fails int) {
	fmt.Printf("%-40s %9s %9s %12.0f %7d\n", name, latency.MS(h.Quantile(50)), latency.MS(h.Quantile(99)),
		float64(h.Count())/d.Seconds(), fails)
}

func printHeader() {
	fmt.Printf("%-40s %9s %9s %12s %7s\n", "measurement", "p50", "p99", "ops/s", "errors")
}

// benchCommand is a benchmark on the embedded cluster: run gets the cluster, its
// first local epoch group and the --duration of each measurement, after the
// table header is printed.
func benchCommand(use, short string, run func(c *localcluster.Cluster, group topology.Group, d time.Duration) error) *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			c, group, err := f.startBench()
			if err != nil {
				return err
			}
			defer c.Close()
			printHeader()
			return run(c, group, f.duration)
		},
	}
	f.register(cmd)
	return cmd
}

func benchRaftCmd() *cobra.Command {
	return benchCommand("raft", "Floor of the commit path: loopback RPC round trip, fsync, one 3-replica Raft commit",
		func(c *localcluster.Cluster, group topology.Group, d time.Duration) error {
			h, err := experiment.MeasurePing(c, group, d)
			if err != nil {
				return err
			}
			printRow("loopback round trip", h, d, 0)

			if h, err = experiment.MeasureFsync(c.DataDir(), d); err != nil {
				return err
			}
			printRow("fsync (4 KiB write + fsync)", h, d, 0)

			leader := func() *raftgroup.Group {
				if n := c.Node(c.Leader(group.ID)); n != nil {
					return n.Group(group.ID)
				}
				return nil
			}
			for _, workers := range []int{1, 16} {
				h, fails := runFor(d, workers, func(ctx context.Context) error {
					g := leader()
					if g == nil {
						return raftgroup.ErrNotLeader
					}
					_, err := g.Propose(ctx, epoch.EncodeNop())
					return err
				})
				printRow(fmt.Sprintf("raft commit, 3 replicas, %d proposer(s)", workers), h, d, fails)
			}
			return nil
		})
}

func benchEpochCmd() *cobra.Command {
	return benchCommand("epoch", "Linearizable ReadEpoch latency and throughput with 1 and 64 concurrent readers",
		func(c *localcluster.Cluster, group topology.Group, d time.Duration) error {
			for _, readers := range []int{1, 64} {
				r, err := c.EpochReader(group.Region)
				if err != nil {
					return err
				}
				h, fails := runFor(d, readers, func(ctx context.Context) error {
					_, err := r.Read(ctx)
					return err
				})
				printRow(fmt.Sprintf("ReadEpoch, %d reader(s)", readers), h, d, fails)
				st := r.Stats()
				fmt.Printf("  %d reads in %d rounds (%.1f reads per round of %d requests, %d asked first), %d split replies retried, %d rounds asked the rest\n",
					h.Count(), st.Rounds, float64(h.Count())/float64(max(st.Rounds, 1)), len(group.Replicas), len(group.Replicas)/2+1, st.Splits, st.Hedges)
				fmt.Printf("  per read: waited %.3f ms for its round to begin; a round took %.3f ms to decide\n",
					st.Waited.Seconds()*1e3/float64(max(st.Reads, 1)), st.InRounds.Seconds()*1e3/float64(max(st.Rounds, 1)))
			}
			return nil
		})
}
