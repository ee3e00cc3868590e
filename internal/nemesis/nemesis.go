// Package nemesis runs a randomized fault campaign against an embedded
// cluster while clients in every data region run transactions, and checks
// what they saw: porcupine for strict serializability of multi-key
// transactions and linearizable snapshots over small key groups, bank totals
// read by snapshots, and recovery after every fault. A seed makes the
// workload's and the faults' choices repeatable.
package nemesis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/history"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// Config is one campaign.
type Config struct {
	// Topology needs at least one data region.
	Topology *topology.Topology
	// Duration of the fault schedule (the checks follow it).
	Duration time.Duration
	// Seed makes the workload's and the schedule's choices repeatable.
	Seed uint64
	// Out receives the histories and the seed when a check fails ("": none).
	Out string
	// FaultEvery is the time between faults (default 3 s).
	FaultEvery time.Duration
	// Faults are the kinds injected (default: FaultKinds, all of them).
	Faults []string
}

// Summary is what a campaign did and found.
type Summary struct {
	Seed uint64
	// Ops counts operations by kind and outcome ("txn committed", ...).
	Ops map[string]int
	// Faults counts injected faults by kind.
	Faults map[string]int
	// Recovery is, per fault kind, the time from healing until every data
	// region committed again.
	Recovery map[string]*latency.Histogram
	// Anomalies found; a correct system finds none.
	Anomalies []string
}

// Fault kinds.
const (
	faultKillNode   = "kill and restart a node"
	faultKillLeader = "kill and restart a range leader"
	faultCutRegion  = "cut a region off"
	faultDrop       = "drop 10% of messages"
	faultDelay      = "delay every message 20 ms"
	faultRestartAll = "restart the whole cluster from disk"
	faultExclude    = "exclude a cut-off region and readmit it"
)

// FaultKinds lists every kind of fault a campaign injects.
var FaultKinds = []string{faultKillNode, faultKillLeader, faultCutRegion, faultDrop, faultDelay, faultRestartAll, faultExclude}

// groups and accounts size the workload: independent key groups checked
// apart by porcupine, and bank accounts.
const (
	groups       = 4
	accounts     = 8
	initialFunds = 100
)

type campaign struct {
	cfg     Config
	c       *localcluster.Cluster
	regions []string
	keys    []ycsb.KeySpace // per data region
	start   time.Time

	mu        sync.Mutex
	recorders [groups]*history.Recorder
	sum       *Summary
}

func (cp *campaign) count(what string) {
	cp.mu.Lock()
	cp.sum.Ops[what]++
	cp.mu.Unlock()
}

func (cp *campaign) anomaly(format string, args ...any) {
	cp.mu.Lock()
	cp.sum.Anomalies = append(cp.sum.Anomalies, fmt.Sprintf(format, args...))
	cp.mu.Unlock()
}

// modelKey names key k of group g. The group's keys are spread over the data
// regions in order (the first ones in the first region), so multi-key
// transactions commit across regions, and the real keys sort as the model's
// do, which the model's scans need.
func (cp *campaign) modelKey(g int) func(int) []byte {
	return func(k int) []byte {
		return cp.key(k*len(cp.keys)/history.Keys, fmt.Sprintf("nemesis-g%d-k%d", g, k))
	}
}

// key returns name homed in data region i mod the number of them (under the
// first range prefix of the region's YCSB key space).
func (cp *campaign) key(i int, name string) []byte {
	return append(append([]byte{}, cp.keys[i%len(cp.keys)].Prefixes[0]...), name...)
}

func (cp *campaign) account(i int) []byte { return cp.key(i, fmt.Sprintf("nemesis-acct-%02d", i)) }

// Run starts the cluster of cfg.Topology, runs the campaign and its checks,
// and stops the cluster. It returns the summary, and an error if the cluster
// could not start or a check found an anomaly.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if cfg.FaultEvery <= 0 {
		cfg.FaultEvery = 3 * time.Second
	}
	for _, k := range cfg.Faults {
		if !slices.Contains(FaultKinds, k) {
			return nil, fmt.Errorf("nemesis: unknown fault kind %q (one of %q)", k, FaultKinds)
		}
	}
	dir, err := os.MkdirTemp("", "terroir-nemesis-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	c, err := localcluster.Start(cfg.Topology, localcluster.Options{DataDir: dir, Keep: true, OrphanAfter: time.Second})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cp := &campaign{cfg: cfg, c: c, start: time.Now(),
		sum: &Summary{Seed: cfg.Seed, Ops: map[string]int{}, Faults: map[string]int{}, Recovery: map[string]*latency.Histogram{}}}
	for i := range cp.recorders {
		cp.recorders[i] = &history.Recorder{}
	}
	for _, r := range cfg.Topology.Regions {
		if ks, err := ycsb.RegionKeys(cfg.Topology, r); err == nil {
			cp.regions, cp.keys = append(cp.regions, r), append(cp.keys, ks)
		}
	}
	if len(cp.regions) == 0 {
		return nil, errors.New("nemesis: the topology has no data region")
	}
	// Model keys must sort as the model's: order the regions by their keys.
	order := make([]int, len(cp.regions))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		return string(cp.keys[order[a]].Prefixes[0]) < string(cp.keys[order[b]].Prefixes[0])
	})
	regions, keys := cp.regions, cp.keys
	cp.regions, cp.keys = nil, nil
	for _, i := range order {
		cp.regions, cp.keys = append(cp.regions, regions[i]), append(cp.keys, keys[i])
	}
	dbs := make([]*client.DB, len(cp.regions))
	for i, r := range cp.regions {
		if dbs[i], err = c.Client(r); err != nil {
			return nil, err
		}
	}
	if err := cp.fund(ctx, dbs[0]); err != nil {
		return nil, err
	}

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var wg sync.WaitGroup
	for i, db := range dbs {
		for w := 0; w < 2; w++ {
			id := i*2 + w
			wg.Add(1)
			go func() { defer wg.Done(); cp.txnClient(runCtx, db, id) }()
		}
		wg.Add(1)
		go func() { defer wg.Done(); cp.bankClient(runCtx, db, 100+i) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); cp.auditor(runCtx, dbs[len(dbs)-1]) }()
	cp.faults(runCtx, dbs)
	wg.Wait()
	c.Dialer(cp.regions[0]).Network().Heal()
	cp.final(ctx, dbs[0])
	cp.check()
	if len(cp.sum.Anomalies) > 0 {
		return cp.sum, cp.dump()
	}
	return cp.sum, nil
}

// fund creates the bank accounts.
func (cp *campaign) fund(ctx context.Context, db *client.DB) error {
	return db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for i := 0; i < accounts; i++ {
			if err := tx.Put(ctx, cp.account(i), []byte(fmt.Sprint(initialFunds))); err != nil {
				return err
			}
		}
		return nil
	})
}

// opTimeout bounds one transaction with its retries.
const opTimeout = 5 * time.Second

// txnClient runs random transactions over one key group at a time, every
// fourth a linearizable snapshot, and records them.
func (cp *campaign) txnClient(ctx context.Context, db *client.DB, id int) {
	r := rand.New(rand.NewPCG(cp.cfg.Seed, uint64(id)))
	for seq := 0; ctx.Err() == nil; seq++ {
		g := r.IntN(groups)
		snapshot := seq%4 == 3
		txn := history.RandomTxn(r, id+1, seq)
		if snapshot {
			txn = history.RandomReadOnly(r)
		}
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		call := time.Since(cp.start).Nanoseconds()
		var out history.Outcome
		var err error
		kind := "transaction"
		if snapshot {
			kind = "linearizable snapshot"
			_, err = db.View(octx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
				out, err = Execute(ctx, s, txn, cp.modelKey(g))
				return err
			})
		} else {
			err = db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
				out, err = Execute(ctx, tx, txn, cp.modelKey(g))
				return err
			})
		}
		ret := time.Since(cp.start).Nanoseconds()
		cancel()
		cp.mu.Lock()
		switch {
		case err == nil:
			cp.recorders[g].Committed(id, txn, out, call, ret)
			cp.sum.Ops[kind+" committed"]++
		case errors.Is(err, client.ErrCommitUnknown):
			cp.recorders[g].Unknown(id, txn, out, call)
			cp.sum.Ops[kind+" outcome unknown"]++
		default:
			cp.sum.Ops[kind+" failed"]++ // never committed: not in the history
		}
		cp.mu.Unlock()
	}
}

// bankClient moves money between random accounts.
func (cp *campaign) bankClient(ctx context.Context, db *client.DB, id int) {
	r := rand.New(rand.NewPCG(cp.cfg.Seed, uint64(id)))
	for ctx.Err() == nil {
		from, to, amount := r.IntN(accounts), r.IntN(accounts), 1+r.IntN(10)
		if from == to {
			continue
		}
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		err := db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
			a, err := readInt(ctx, tx, cp.account(from))
			if err != nil {
				return err
			}
			b, err := readInt(ctx, tx, cp.account(to))
			if err != nil {
				return err
			}
			if err := tx.Put(ctx, cp.account(from), []byte(fmt.Sprint(a-amount))); err != nil {
				return err
			}
			return tx.Put(ctx, cp.account(to), []byte(fmt.Sprint(b+amount)))
		})
		cancel()
		switch {
		case err == nil:
			cp.count("bank transfer committed")
		case errors.Is(err, client.ErrCommitUnknown):
			cp.count("bank transfer outcome unknown")
		default:
			cp.count("bank transfer failed")
		}
	}
}

func readInt(ctx context.Context, tx accountReader, key []byte) (int, error) {
	v, ok, err := tx.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("nemesis: account %q is missing", key)
	}
	var n int
	_, err = fmt.Sscan(string(v), &n)
	return n, err
}

// accountReader is what reading an account needs: a transaction or a snapshot.
type accountReader interface {
	Get(ctx context.Context, key []byte) ([]byte, bool, error)
}

// auditor reads every account in a linearizable snapshot every second: the
// total never changes.
func (cp *campaign) auditor(ctx context.Context, db *client.DB) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cp.audit(ctx, db)
	}
}

func (cp *campaign) audit(ctx context.Context, db *client.DB) {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	total := 0
	_, err := db.View(octx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		total = 0
		for i := 0; i < accounts; i++ {
			n, err := readInt(ctx, s, cp.account(i))
			if err != nil {
				return err
			}
			total += n
		}
		return nil
	})
	if err != nil {
		cp.count("bank audit failed")
		return
	}
	cp.count("bank audit committed")
	if total != accounts*initialFunds {
		cp.anomaly("bank total %d in a linearizable snapshot, want %d", total, accounts*initialFunds)
	}
}

// faults injects one random fault every FaultEvery until ctx ends, heals it,
// and measures the recovery.
func (cp *campaign) faults(ctx context.Context, dbs []*client.DB) {
	r := rand.New(rand.NewPCG(cp.cfg.Seed, 999))
	net := cp.c.Dialer(cp.regions[0]).Network()
	nodes := cp.c.NodeIDs()
	ranges := cp.cfg.Topology.Ranges()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(cp.cfg.FaultEvery):
		}
		kinds := cp.cfg.Faults
		if len(kinds) == 0 {
			kinds = FaultKinds
		}
		kind := kinds[r.IntN(len(kinds))]
		hold := time.Second + time.Duration(r.IntN(1000))*time.Millisecond
		var heal func() error
		switch kind {
		case faultKillNode, faultKillLeader:
			id := nodes[r.IntN(len(nodes))]
			if kind == faultKillLeader {
				if l := cp.c.Leader(ranges[r.IntN(len(ranges))].ID); l != 0 {
					id = l
				}
			}
			if err := cp.c.StopNode(id); err != nil {
				cp.anomaly("stopping node %d: %v", id, err)
				continue
			}
			heal = func() error { return cp.c.RestartNode(id) }
		case faultCutRegion:
			net.CutRegion(cp.regions[r.IntN(len(cp.regions))])
			heal = func() error { net.Heal(); return nil }
		case faultDrop:
			net.SetDropRate(0.1)
			heal = func() error { net.Heal(); return nil }
		case faultDelay:
			net.SetExtraDelay(20 * time.Millisecond)
			heal = func() error { net.Heal(); return nil }
		case faultRestartAll:
			var errs []error
			for _, id := range nodes {
				errs = append(errs, cp.c.StopNode(id))
			}
			if err := errors.Join(errs...); err != nil {
				cp.anomaly("stopping every node: %v", err)
			}
			heal = func() error {
				var errs []error
				for _, id := range nodes {
					errs = append(errs, cp.c.RestartNode(id))
				}
				return errors.Join(errs...)
			}
		case faultExclude:
			region := cp.regions[r.IntN(len(cp.regions))]
			net.CutRegion(region)
			if err := cp.setExcluded(region, true); err != nil {
				net.Heal()
				cp.anomaly("excluding %s: %v", region, err)
				continue
			}
			heal = func() error {
				net.Heal()
				return cp.setExcluded(region, false)
			}
		}
		cp.mu.Lock()
		cp.sum.Faults[kind]++
		cp.mu.Unlock()
		time.Sleep(hold)
		if err := heal(); err != nil {
			cp.anomaly("healing %q: %v", kind, err)
			continue
		}
		healed := time.Now()
		if err := cp.probe(dbs); err != nil {
			cp.anomaly("no recovery within 30 s after %q: %v", kind, err)
			continue
		}
		cp.mu.Lock()
		if cp.sum.Recovery[kind] == nil {
			cp.sum.Recovery[kind] = latency.New()
		}
		cp.sum.Recovery[kind].Since(healed)
		cp.mu.Unlock()
	}
}

// setExcluded excludes region from the global epoch service's set, or
// readmits it, if the topology has a global epoch service.
func (cp *campaign) setExcluded(region string, excluded bool) error {
	global := cp.cfg.Topology.GroupsOfKind(topology.KindGlobalEpoch, "")
	if len(global) == 0 || len(cp.cfg.Topology.GroupsOfKind(topology.KindPublisher, region)) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The operator sits with the global epoch service, not in the cut region.
	return admin.SetRegionExcluded(ctx, cp.c.Dialer(global[0].Region), cp.cfg.Topology, region, excluded)
}

// probe commits one write in every data region, retrying for up to 30 s.
func (cp *campaign) probe(dbs []*client.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, db := range dbs {
		key := cp.key(i, "nemesis-probe")
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, key, []byte("x")) }); err != nil {
			return fmt.Errorf("%s: %w", cp.regions[i], err)
		}
	}
	return nil
}

// final reads every group in a locking transaction after healing, so the
// history's last word is the database's state: an acknowledged write that was
// lost shows up as an illegal history.
func (cp *campaign) final(ctx context.Context, db *client.DB) {
	cp.audit(ctx, db)
	var txn history.Txn
	for k := 0; k < history.Keys; k++ {
		txn.Ops = append(txn.Ops, history.Op{Kind: history.Get, Key: k})
	}
	for g := range groups {
		var out history.Outcome
		call := time.Since(cp.start).Nanoseconds()
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
			var err error
			out, err = Execute(ctx, tx, txn, cp.modelKey(g))
			return err
		})
		cancel()
		if err != nil {
			cp.anomaly("final read of group %d: %v", g, err)
			continue
		}
		cp.recorders[g].Committed(1000, txn, out, call, time.Since(cp.start).Nanoseconds())
	}
}

// check runs porcupine on every group's history.
func (cp *campaign) check() {
	for g, rec := range cp.recorders {
		res, _ := porcupine.CheckOperationsVerbose(history.Model, rec.Operations(), 2*time.Minute)
		switch res {
		case porcupine.Ok:
		case porcupine.Unknown:
			cp.anomaly("group %d: porcupine could not decide within 2 min", g)
		default:
			committed, _ := rec.Len()
			cp.anomaly("group %d: the history of %d transactions is not strictly serializable", g, committed)
		}
	}
}

// dump writes every group's history (porcupine's visualization) and the seed
// into cfg.Out, and returns the error Run reports.
func (cp *campaign) dump() error {
	err := fmt.Errorf("nemesis: %d anomalies (seed %d)", len(cp.sum.Anomalies), cp.cfg.Seed)
	if cp.cfg.Out == "" {
		return err
	}
	if mkErr := os.MkdirAll(cp.cfg.Out, 0o755); mkErr != nil {
		return errors.Join(err, mkErr)
	}
	for g, rec := range cp.recorders {
		_, info := porcupine.CheckOperationsVerbose(history.Model, rec.Operations(), time.Minute)
		_ = porcupine.VisualizePath(history.Model, info, filepath.Join(cp.cfg.Out, fmt.Sprintf("history-group-%d.html", g)))
	}
	seed := fmt.Sprintf("seed %d\nanomalies:\n", cp.cfg.Seed)
	for _, a := range cp.sum.Anomalies {
		seed += "  " + a + "\n"
	}
	return errors.Join(err, os.WriteFile(filepath.Join(cp.cfg.Out, "seed.txt"), []byte(seed), 0o644))
}

// Write prints the summary.
func (s *Summary) Write(w io.Writer) {
	fmt.Fprintf(w, "seed %d\n\noperations:\n", s.Seed)
	for _, k := range sortedKeys(s.Ops) {
		fmt.Fprintf(w, "  %-40s %d\n", k, s.Ops[k])
	}
	fmt.Fprintf(w, "\nfaults injected, and recovery (from healing until every data region committed again):\n")
	for _, k := range sortedKeys(s.Faults) {
		line := fmt.Sprintf("  %-40s %d", k, s.Faults[k])
		if h := s.Recovery[k]; h != nil && h.Count() > 0 {
			line += fmt.Sprintf("   recovery p50 %s max %s", latency.MS(h.Quantile(50)), latency.MS(h.Quantile(100)))
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "\nanomalies: %d\n", len(s.Anomalies))
	for _, a := range s.Anomalies {
		fmt.Fprintf(w, "  %s\n", a)
	}
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
