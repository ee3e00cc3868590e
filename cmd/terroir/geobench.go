package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// benchGeoCmd measures follower reads across regions (DESIGN.md §13): on
// the three-region layout, the ranges homed in us-east1 get a non-voting
// replica in us-west1 (a global span), and a us-west1 client reads
// us-east1 keys in snapshots, served by the local non-voter and by the
// leader across the WAN, in alternating rounds of one run, while us-east1
// clients write them. It also samples the closed-epoch lag (publisher
// epoch minus closed epoch) at the leader and at the non-voter.
func benchGeoCmd() *cobra.Command {
	var f benchFlags
	var rounds, readers, writers int
	cmd := &cobra.Command{
		Use:   "geo",
		Short: "Snapshot reads of a us-east1 key from us-west1: local non-voter vs leader across the WAN; closed-epoch lag",
		Long: "geo starts the embedded three-region cluster (examples/three-regions.yaml unless --config names\n" +
			"another with us-east1 and us-west1), adds a non-voting replica on a us-west1 node to every range\n" +
			"homed in us-east1, and, while us-east1 clients write those keys, reads them from a us-west1\n" +
			"client in SerializableStale and Strong snapshots: served by the local non-voter (follower reads\n" +
			"preferred) and by the leader (follower reads off), in alternating rounds of --duration. It prints\n" +
			"P50/P99 of each, the share the non-voter served, and the closed-epoch lag P50/P99 (epochs) at\n" +
			"the leader and the non-voter, sampled every 20 ms. Last, while writers in both regions update\n" +
			"keys of us-east1's range [g, m), it rehomes that range to us-west1 and prints each region's\n" +
			"write P50/P99 before, during and after, and how long the rehome took.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return runGeoBench(&f, rounds, readers, writers)
		},
	}
	f.register(cmd)
	cmd.Flags().Lookup("config").Usage = "topology file (default: the embedded examples/three-regions.yaml)"
	cmd.Flags().IntVar(&rounds, "rounds", 3, "rounds; each measures every read kind for --duration")
	cmd.Flags().IntVar(&readers, "readers", 2, "concurrent us-west1 readers")
	cmd.Flags().IntVar(&writers, "writers", 2, "concurrent us-east1 writers")
	return cmd
}

// geoRead is one kind of read the geo benchmark measures.
type geoRead struct {
	name   string
	mode   client.SnapshotMode
	policy client.FollowerReads
}

func runGeoBench(f *benchFlags, rounds, readers, writers int) error {
	top, err := topology.Parse(examples.ThreeRegions)
	if f.config != "" {
		top, err = topology.Load(f.config)
	}
	if err != nil {
		return err
	}
	const home, away = "us-east1", "us-west1"
	if !top.HasRegion(home) || !top.HasRegion(away) {
		return fmt.Errorf("the topology needs regions %s and %s", home, away)
	}
	c, err := localcluster.Start(top, localcluster.Options{Insecure: f.insecure})
	if err != nil {
		return err
	}
	defer c.Close()
	keys, err := ycsb.RegionKeys(c.Topology, home)
	if err != nil {
		return err
	}
	east, err := c.Client(home)
	if err != nil {
		return err
	}
	west, err := c.Client(away)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const records = 100
	for i := range records {
		if err := east.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, keys.Key(uint64(i)), []byte("v")) }); err != nil {
			return fmt.Errorf("loading: %w", err)
		}
	}
	nonVoter := firstNodeOf(c.Topology, away)
	var homed []uint64
	for _, g := range c.Topology.Ranges() {
		if g.Region != home {
			continue
		}
		r, err := east.AdminAddNonVoter(ctx, append([]byte(g.Start), 0), nonVoter)
		if err != nil {
			return fmt.Errorf("adding range %d's non-voter on node %d: %w", g.ID, nonVoter, err)
		}
		homed = append(homed, r.ID)
	}
	fmt.Printf("non-voting replicas of us-east1's ranges %v on node %d (%s); RTT %s–%s %v\n",
		homed, nonVoter, away, home, away, c.Topology.RTT(home, away))

	stop := make(chan struct{})
	var bg sync.WaitGroup
	for range writers { // the keys change while they are read
		bg.Add(1)
		go func() {
			defer bg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = east.Update(wctx, func(ctx context.Context, tx *client.Txn) error {
					return tx.Put(ctx, keys.Key(rand.Uint64N(records)), []byte(time.Now().String()))
				})
				wcancel()
			}
		}()
	}
	lagLeader, lagNonVoter := hdrhistogram.New(0, 1<<20, 3), hdrhistogram.New(0, 1<<20, 3)
	bg.Add(1)
	go func() {
		defer bg.Done()
		sampleClosedLag(c, homed[0], nonVoter, stop, lagLeader, lagNonVoter)
	}()

	kinds := []geoRead{
		{"stale read, local non-voter", client.SerializableStale, client.FollowerReadsNearest},
		{"stale read, leader across the WAN", client.SerializableStale, client.FollowerReadsOff},
		{"strong read, local non-voter", client.Strong, client.FollowerReadsPreferred},
		{"strong read, leader across the WAN", client.Strong, client.FollowerReadsOff},
	}
	hists := make([]*latency.Histogram, len(kinds))
	fails := make([]int, len(kinds))
	served, total := make([]int, len(kinds)), make([]int, len(kinds))
	for r := range rounds {
		for i := range kinds {
			k := (i + r) % len(kinds) // rotate which goes first
			west.SetFollowerReads(kinds[k].policy)
			var mu sync.Mutex
			h, n := runFor(f.duration, readers, func(ctx context.Context) error {
				st, err := west.View(ctx, kinds[k].mode, func(ctx context.Context, s *client.Snapshot) error {
					_, _, err := s.Get(ctx, keys.Key(rand.Uint64N(records)))
					return err
				})
				if err == nil {
					mu.Lock()
					served[k] += st.FollowerReads
					total[k]++
					mu.Unlock()
				}
				return err
			})
			if hists[k] == nil {
				hists[k] = latency.New()
			}
			hists[k].Merge(h)
			fails[k] += n
		}
	}
	close(stop)
	bg.Wait()

	span := time.Duration(rounds) * f.duration
	printHeader()
	for k, kind := range kinds {
		printRow(kind.name, hists[k], span, fails[k])
	}
	for k, kind := range kinds {
		fmt.Printf("%-40s served by the non-voter: %d of %d\n", kind.name, served[k], total[k])
	}
	if p := hists[1].Quantile(50); p > 0 {
		fmt.Printf("stale read P50, non-voter / leader: %.3f\n", float64(hists[0].Quantile(50))/float64(p))
	}
	fmt.Printf("closed-epoch lag (epochs), leader of range %d:  P50 %d  P99 %d  (%d samples)\n", homed[0],
		lagLeader.ValueAtQuantile(50), lagLeader.ValueAtQuantile(99), lagLeader.TotalCount())
	fmt.Printf("closed-epoch lag (epochs), non-voter on node %d: P50 %d  P99 %d  (%d samples)\n", nonVoter,
		lagNonVoter.ValueAtQuantile(50), lagNonVoter.ValueAtQuantile(99), lagNonVoter.TotalCount())
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	return benchRehome(rctx, map[string]*client.DB{home: east, away: west}, home, away, writers, f.duration)
}

// firstNodeOf is the lowest-numbered node of region.
func firstNodeOf(top *topology.Topology, region string) uint64 {
	for _, n := range top.Nodes {
		if n.Region == region {
			return n.ID
		}
	}
	return 0
}

// sampleClosedLag records, every 20 ms until stop, range id's closed-epoch
// lag at its leader and at its replica on node nonVoter: the home
// region's publisher epoch minus the replica's closed epoch.
func sampleClosedLag(c *localcluster.Cluster, id, nonVoter uint64, stop <-chan struct{}, leader, far *hdrhistogram.Histogram) {
	region := ""
	for _, g := range c.Topology.Ranges() {
		if g.ID == id {
			region = g.Region
		}
	}
	pub, err := c.Reader(topology.KindPublisher, region, region)
	if err != nil {
		return
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		p, err := pub.Read(ctx)
		cancel()
		if err != nil {
			continue
		}
		record := func(node uint64, h *hdrhistogram.Histogram) {
			n := c.Node(node)
			if n == nil {
				return
			}
			r := n.Range(id)
			if r == nil {
				return
			}
			if closed, err := r.ClosedEpoch(nil, nil); err == nil && p >= closed {
				_ = h.RecordValue(int64(p - closed))
			}
		}
		if l := c.Leader(id); l != 0 {
			record(l, leader)
		}
		record(nonVoter, far)
	}
}
