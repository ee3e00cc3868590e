// Package experiment runs the paper's §6.2 evaluation on an embedded cluster
// (DESIGN.md §9): YCSB-A on data homed in each data region from clients in
// that region, while a client in the last data region (us-west1 in the
// paper) runs a strong multi-region snapshot reading one key per data region
// every 100 ms, alternately in the paper's strong mode (the epoch read from
// the global epoch service) and in strong-local (the same guarantee, from
// the local publisher: DESIGN.md §5); it measures the global epoch
// interval, the snapshots' epoch wait and total time in each mode, and the
// regional transactions' latencies. `terroir demo` and `terroir bench
// paper` both run it.
package experiment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// Config is one run.
type Config struct {
	// Topology must have a global epoch service and at least two data regions.
	Topology *topology.Topology
	// Duration is how long the measured run lasts (after loading).
	Duration time.Duration
	// Records is the YCSB table size per data region (1 KiB each).
	Records int
	// Threads is the number of YCSB client threads per data region (paper: 5).
	Threads int
	// SnapshotEvery is the strong snapshots' period (paper: 100 ms), the
	// two strong modes taking turns.
	SnapshotEvery time.Duration
	// Seed makes the records and operation sequences repeatable.
	Seed uint64
	// DataDir holds the nodes' stores ("": a temporary directory); Keep keeps
	// it after the run.
	DataDir string
	Keep    bool
	// Started, if set, is called once the cluster runs, with the web console
	// URL of its first node.
	Started func(consoleURL string)
}

// Progress is the state of a run, reported about once a second.
type Progress struct {
	// Elapsed of Duration so far.
	Elapsed, Duration time.Duration
	// Txns is the number of YCSB transactions completed so far; TxnsPerSec
	// their rate over the last report's interval.
	Txns       int64
	TxnsPerSec float64
	// GlobalEpoch is the global epoch at the first data region's publisher;
	// LocalEpochs each data region's local epoch, in Result.Regions order.
	GlobalEpoch uint64
	LocalEpochs []uint64
	// ReadP50, WriteP50 and SnapshotP50 are over the last interval (0: none).
	ReadP50, WriteP50, SnapshotP50 time.Duration
	// Snapshots is the number of strong snapshots completed so far.
	Snapshots int64
}

// Result is a finished run's figures.
type Result struct {
	Config Config
	// Regions are the data regions; SnapshotRegion runs the snapshots.
	Regions        []string
	SnapshotRegion string
	// GlobalInterval is the time between global epoch advances.
	GlobalInterval *latency.Histogram
	// Snapshots are each snapshot mode's figures, in the order the modes
	// take turns (snapshotModes): strong, the paper's, first.
	Snapshots []SnapshotFigures
	// SnapshotFails counts the snapshots of any mode that failed.
	SnapshotFails int
	// YCSB holds each data region's result, in Regions order.
	YCSB []*ycsb.Result
	// Floor is this machine's loopback round trip and fsync, measured
	// before the run.
	RTT, Fsync *latency.Histogram
	// Homes is where the data lived at the end (DESIGN.md §13): every
	// range's span, home region and replicas, by start key, and the
	// placement rules with how far the ranges matched them.
	Homes      []client.RangeInfo
	Placements []client.PlacementStatus
	// Rounds is what the global epoch's rounds spent in each phase during
	// the run.
	Rounds RoundPhases
	// Device is the write load on the block device of the cluster's data
	// directory during the run, every process's (DeviceOK false: none
	// measured, as on a tmpfs).
	Device   DeviceLoad
	DeviceOK bool
}

// SnapshotFigures are one snapshot mode's figures in a run.
type SnapshotFigures struct {
	Mode client.SnapshotMode
	// Wait is each snapshot's wait for its epoch (SnapshotStats.EpochWait);
	// Total its whole duration.
	Wait, Total *latency.Histogram
}

// snapshotModes are the modes the run's snapshots take turns in: strong,
// the paper's (the epoch read from the global epoch service), and
// strong-local, the same guarantee with the epoch read from the snapshot
// region's publisher and two advances waited for (DESIGN.md §5).
var snapshotModes = []client.SnapshotMode{client.Strong, client.StrongLocal}

// DataRegions returns the regions that home ranges, in topology order.
func DataRegions(top *topology.Topology) []string {
	var out []string
	for _, r := range top.Regions {
		for _, g := range top.Ranges() {
			if g.Region == r {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// window is the last interval's latencies.
type window struct {
	mu                    sync.Mutex
	reads, writes, snaps  *latency.Histogram
	txns, prevTxns, snapN atomic.Int64
}

func (w *window) reset() (reads, writes, snaps *latency.Histogram) {
	w.mu.Lock()
	defer w.mu.Unlock()
	reads, writes, snaps = w.reads, w.writes, w.snaps
	w.reads, w.writes, w.snaps = latency.New(), latency.New(), latency.New()
	return
}

func (w *window) record(pick func(w *window) *latency.Histogram, d time.Duration) {
	w.mu.Lock()
	h := pick(w)
	w.mu.Unlock()
	h.Record(d)
}

// Run starts the cluster, loads the tables and runs the experiment, calling
// progress (if not nil) about once a second from one goroutine. It stops the
// cluster before returning. Errors: a topology unfit for the run, a cluster
// that does not start, a load that fails, or ctx's end before the run began.
func Run(ctx context.Context, cfg Config, progress func(Progress)) (*Result, error) {
	top := cfg.Topology
	global := top.GroupsOfKind(topology.KindGlobalEpoch, "")
	regions := DataRegions(top)
	if len(global) == 0 || len(regions) < 2 {
		return nil, errors.New("experiment: the topology needs a global epoch service and two data regions")
	}
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = 100 * time.Millisecond
	}
	c, err := localcluster.Start(top, localcluster.Options{DataDir: cfg.DataDir, Keep: cfg.Keep})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if cfg.Started != nil {
		cfg.Started("http://" + c.Node(top.Nodes[0].ID).HTTPAddr() + "/")
	}
	res := &Result{Config: cfg, Regions: regions, SnapshotRegion: regions[len(regions)-1],
		GlobalInterval: latency.New()}
	for _, m := range snapshotModes {
		res.Snapshots = append(res.Snapshots, SnapshotFigures{Mode: m, Wait: latency.New(), Total: latency.New()})
	}
	ld, err := load(ctx, c, cfg, regions)
	if err != nil {
		return nil, err
	}
	w, dbs, keys, locals := ld.workload, ld.dbs, ld.keys, ld.locals
	stores := ld.stores
	if res.RTT, res.Fsync, err = floor(c, regions[0]); err != nil {
		return nil, err
	}
	pub, err := c.Reader(topology.KindPublisher, regions[0], regions[0])
	if err != nil {
		return nil, err
	}
	svc, err := c.Reader(topology.KindGlobalEpoch, global[0].Region, global[0].Region)
	if err != nil {
		return nil, err
	}

	far, ok := top.FarthestPublisher(global[0].Region)
	if !ok {
		return nil, errors.New("experiment: the topology has no publisher")
	}
	pingFar, err := Pinger(c, global[0].Region, far)
	if err != nil {
		return nil, err
	}
	farRTT := latency.New()

	rounds := SampleRounds(c)
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	device := WatchDevice(runCtx, c.DataDir())
	win := &window{}
	win.reset()
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); measureGlobalInterval(runCtx, svc, res.GlobalInterval) }()
	go func() { defer wg.Done(); measureRTT(runCtx, pingFar, farRTT) }()
	go func() {
		defer wg.Done()
		res.SnapshotFails = snapshots(runCtx, cfg, dbs[len(dbs)-1], keys, res, win)
	}()
	res.YCSB = make([]*ycsb.Result, len(regions))
	var runs errgroup.Group
	for i := range regions {
		runs.Go(func() error {
			var err error
			res.YCSB[i], err = ycsb.Run(runCtx, stores[i], ycsb.Config{Workload: w, Keys: keys[i], Clients: cfg.Threads,
				Duration: cfg.Duration, Seed: cfg.Seed + uint64(i),
				Observe: func(op ycsb.Op, d time.Duration) {
					win.txns.Add(1)
					if op == ycsb.OpRead {
						win.record(func(w *window) *latency.Histogram { return w.reads }, d)
					} else {
						win.record(func(w *window) *latency.Histogram { return w.writes }, d)
					}
				}})
			return err
		})
	}
	if progress != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			report(runCtx, cfg, win, pub, locals, progress)
		}()
	}
	err = runs.Wait()
	wg.Wait()
	cancel() // the run is over: stop watching the device
	res.Device, res.DeviceOK = device()
	res.Rounds = SampleRounds(c).since(rounds)
	res.Rounds.FarthestRTT = c.Topology.FarthestPublisherRTT()
	res.Rounds.MeasuredRTT = farRTT.Quantile(50)
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	res.Homes, _ = dbs[0].Ranges(hctx) // the report's map of homes: best effort
	res.Placements, _ = dbs[0].Placements(hctx)
	return res, err
}

// loaded is a cluster's YCSB tables and clients, one per data region.
type loaded struct {
	workload ycsb.Workload
	dbs      []*client.DB
	stores   []ycsb.Store // the dbs as YCSB stores
	keys     []ycsb.KeySpace
	locals   []*epoch.Reader
}

// load opens a client, a key space and a local epoch reader in each data
// region and loads its YCSB-A table (uniform, one 1 KiB field per record, as
// the paper ran it), the regions in parallel.
func load(ctx context.Context, c *localcluster.Cluster, cfg Config, regions []string) (*loaded, error) {
	w, _ := ycsb.Core("a")
	w.Distribution, w.RecordCount, w.OperationCount, w.FieldCount, w.FieldLength = ycsb.Uniform, cfg.Records, 0, 1, 1024
	ld := &loaded{workload: w, dbs: make([]*client.DB, len(regions)), stores: make([]ycsb.Store, len(regions)),
		keys: make([]ycsb.KeySpace, len(regions)), locals: make([]*epoch.Reader, len(regions))}
	var err error
	for i, r := range regions {
		if ld.dbs[i], err = c.Client(r); err != nil {
			return nil, err
		}
		ld.stores[i] = ycsb.Terroir(ld.dbs[i])
		if ld.keys[i], err = ycsb.RegionKeys(c.Topology, r); err != nil {
			return nil, err
		}
		if ld.locals[i], err = c.EpochReader(r); err != nil {
			return nil, err
		}
	}
	var loads errgroup.Group
	for i := range regions {
		loads.Go(func() error { return ycsb.Load(ctx, ld.stores[i], w, ld.keys[i], cfg.Seed+uint64(i)) })
	}
	return ld, loads.Wait()
}

// report calls progress every second until ctx ends.
func report(ctx context.Context, cfg Config, win *window, pub *epoch.Reader, locals []*epoch.Reader, progress func(Progress)) {
	began := time.Now()
	last := began
	everyTick(ctx, time.Second, func() {
		now := time.Now()
		reads, writes, snaps := win.reset()
		txns := win.txns.Load()
		p := Progress{Elapsed: now.Sub(began), Duration: cfg.Duration, Txns: txns,
			TxnsPerSec: float64(txns-win.prevTxns.Swap(txns)) / now.Sub(last).Seconds(),
			Snapshots:  win.snapN.Load()}
		last = now
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		p.GlobalEpoch, _ = pub.Read(rctx)
		for _, l := range locals {
			e, _ := l.Read(rctx)
			p.LocalEpochs = append(p.LocalEpochs, e)
		}
		cancel()
		if reads.Count() > 0 {
			p.ReadP50 = reads.Quantile(50)
		}
		if writes.Count() > 0 {
			p.WriteP50 = writes.Quantile(50)
		}
		if snaps.Count() > 0 {
			p.SnapshotP50 = snaps.Quantile(50)
		}
		progress(p)
	})
}

// everyTick calls f every d until ctx ends (not at once: first after d).
func everyTick(ctx context.Context, d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		f()
	}
}

// measureGlobalInterval records the time between global epoch advances, read
// every millisecond at the service (from its own region).
func measureGlobalInterval(ctx context.Context, svc *epoch.Reader, h *latency.Histogram) {
	var last uint64
	var since time.Time
	for ctx.Err() == nil {
		e, err := svc.Read(ctx)
		if err == nil && e != last {
			now := time.Now()
			if last != 0 && e > last {
				per := now.Sub(since) / time.Duration(e-last)
				for range e - last {
					h.Record(per)
				}
			}
			last, since = e, now
		}
		time.Sleep(time.Millisecond)
	}
}

// measureRTT records round trips (ping), one at a time, each begun at the
// first tick of rttEvery after the last ended, until ctx ends.
func measureRTT(ctx context.Context, ping func(ctx context.Context) error, h *latency.Histogram) {
	everyTick(ctx, rttEvery, func() {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start := time.Now()
		if ping(pctx) == nil {
			h.Since(start)
		}
	})
}

// rttEvery is measureRTT's tick: a ping a tick, or one at a time when a
// ping outlasts it (to the farthest publisher, 37 ms: one every 40 ms),
// enough for a P50 of a short run and no load to speak of.
const rttEvery = 20 * time.Millisecond

// snapshots starts a snapshot reading one key per data region, the keys
// read in parallel, at every tick of cfg.SnapshotEvery until ctx ends,
// in snapshotModes by turns, and returns how many failed once all
// have ended. Each runs on its own goroutine, so a snapshot that outlasts
// the tick (a strong one takes ~107 ms) never delays the next. In a closed
// loop a snapshot begun as the last one ended begins at a fixed phase of
// the epoch's round, not a random one: strong-local read 115 ms P50
// right behind strong ones and 93 ms alone, where the open loop reads
// 104-111 ms. At most maxSnapshotsInFlight run at once; a tick that finds
// them all running starts none. The live view's snapshot P50 (win) is the
// strong mode's, the paper's.
func snapshots(ctx context.Context, cfg Config, db *client.DB, keys []ycsb.KeySpace, res *Result, win *window) int {
	tick := time.NewTicker(cfg.SnapshotEvery)
	defer tick.Stop()
	var (
		running sync.WaitGroup
		fails   atomic.Int64
		slots   = make(chan struct{}, maxSnapshotsInFlight)
	)
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			running.Wait()
			return int(fails.Load())
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		default:
			continue
		}
		fig := res.Snapshots[i%len(res.Snapshots)]
		running.Add(1)
		go func() {
			defer func() { <-slots; running.Done() }()
			began := time.Now()
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stats, err := db.View(sctx, fig.Mode, func(ctx context.Context, s *client.Snapshot) error {
				var reads errgroup.Group
				for _, k := range keys {
					reads.Go(func() error {
						_, _, err := s.Get(ctx, k.Key(uint64(i%cfg.Records)))
						return err
					})
				}
				return reads.Wait()
			})
			if err != nil {
				fails.Add(1)
				return
			}
			d := time.Since(began)
			fig.Total.Record(d)
			fig.Wait.Record(stats.EpochWait)
			if fig.Mode == client.Strong {
				win.snapN.Add(1)
				win.record(func(w *window) *latency.Histogram { return w.snaps }, d)
			}
		}()
	}
}

// maxSnapshotsInFlight bounds the snapshots snapshots runs at once: ten
// ticks' worth at the paper's 100 ms, far above the ~2 a healthy run has.
const maxSnapshotsInFlight = 10

// floor measures this machine's loopback round trip and 4 KiB fsync, for
// a second each.
func floor(c *localcluster.Cluster, region string) (rtt, fsync *latency.Histogram, err error) {
	g := c.Topology.GroupsOfKind(topology.KindLocalEpoch, region)
	if len(g) == 0 {
		return nil, nil, fmt.Errorf("experiment: region %s has no local epoch group", region)
	}
	if rtt, err = MeasurePing(c, g[0], time.Second); err != nil {
		return nil, nil, err
	}
	fsync, err = MeasureFsync(c.DataDir(), time.Second)
	return rtt, fsync, err
}

// MeasurePing measures the round trip from a client in group's region to
// one of its replicas, one call at a time, for d (Pinger's calls); a call
// that fails is not counted. Errors: Pinger's.
func MeasurePing(c *localcluster.Cluster, group topology.Group, d time.Duration) (*latency.Histogram, error) {
	ping, err := Pinger(c, group.Region, group)
	if err != nil {
		return nil, err
	}
	h := latency.New()
	for end := time.Now().Add(d); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		err := ping(ctx)
		cancel()
		if err == nil {
			h.Since(start)
		}
	}
	return h, nil
}

// Pinger returns one round trip from a client in region from to one of
// group's replicas: a 64-byte Ping over the node's Multiplex stream
// (transport.Dialer.Multiplexed), a message each way, as a client's calls
// to range leaders, a leader's epoch reads and the global epoch service's
// publishes travel, with the network's delay between the regions
// (DESIGN.md §8). Errors: the dialer's, for a replica it cannot reach.
func Pinger(c *localcluster.Cluster, from string, group topology.Group) (func(ctx context.Context) error, error) {
	conn, err := c.Dialer(from).Multiplexed(group.Replicas[0])
	if err != nil {
		return nil, err
	}
	ping := transportpb.NewTransportClient(conn)
	return func(ctx context.Context) error {
		_, err := ping.Ping(ctx, &transportpb.PingRequest{Payload: make([]byte, 64)})
		return err
	}, nil
}

// MeasureFsync measures a 4 KiB append plus fsync of a file in dir, for d.
func MeasureFsync(dir string, d time.Duration) (*latency.Histogram, error) {
	file, err := os.Create(filepath.Join(dir, "fsync-bench"))
	if err != nil {
		return nil, err
	}
	defer os.Remove(file.Name())
	defer file.Close()
	buf := make([]byte, 4096)
	h := latency.New()
	for end := time.Now().Add(d); time.Now().Before(end); {
		start := time.Now()
		if _, err := file.Write(buf); err != nil {
			return h, err
		}
		if err := file.Sync(); err != nil {
			return h, err
		}
		h.Since(start)
	}
	return h, nil
}
