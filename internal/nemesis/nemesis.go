// Package nemesis runs a randomized fault campaign against an embedded
// cluster while clients in every data region run workloads, and checks what
// they saw, as Jepsen does:
//   - multi-key transactions and linearizable snapshots over small key
//     groups, checked for strict serializability by porcupine;
//   - single-key registers (read, write, compare-and-set; reads in every
//     per-key linearizable snapshot mode), checked by porcupine;
//   - appends to lists, read in every snapshot mode, checked for lost writes
//     and updates, aborted or phantom elements, and diverged, fractured and
//     stale reads;
//   - bank transfers, audited by snapshots in every mode;
//   - long snapshots of the bank, some protected from GC, reread for
//     several gc_ttls while leaders collect: each reread must match;
//   - every epoch group, sampled throughout, checked for monotonicity and the
//     global epoch invariant;
//   - locks of transactions caught in the middle of two-phase commit,
//     released within a bound, and no lock left once the load stops.
//
// A seed makes the workload's and the faults' choices repeatable.
package nemesis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/terroir-db/terroir/client"
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
	// Log, if set, is the process's recent log, written to Out as log.txt
	// when a check fails.
	Log *LogRing
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
	// Released is, for each transaction whose participant's leader was
	// killed in the middle of two-phase commit, the time from the kill until
	// no participant held its locks.
	Released *latency.Histogram
	// EpochReads counts the epoch reads the invariant checks covered.
	EpochReads int
	// QuorumChecks counts the checks, after each healed fault, that every
	// group has a majority of its voters running.
	QuorumChecks int
	// Timeline is every fault drawn, in order; Write prints it when
	// there are anomalies, to place them among the faults.
	Timeline []FaultEvent
	// Anomalies found; a correct system finds none.
	Anomalies []string
}

// FaultEvent is one fault drawn from the schedule: when it began, whether
// it struck (a draw that found nothing to strike goes back in the deck)
// and when it was healed, each since the campaign began (Healed 0: it
// struck nothing, or healing failed).
type FaultEvent struct {
	Kind          string
	Began, Healed time.Duration
	Struck        bool
}

// opTimeout bounds one transaction with its retries.
const opTimeout = 5 * time.Second

// finalClient is the client ID of the reads after the run.
const finalClient = 1000

type campaign struct {
	cfg     Config
	c       *localcluster.Cluster
	regions []string
	keys    []ycsb.KeySpace // per data region
	start   time.Time

	mu       sync.Mutex
	hushed   chan struct{} // under mu: closed when the quiet spell under way ends (nil: none; quiet.go)
	sum      *Summary
	armed    *armedCrash // a mid-2PC fault waiting for its transaction
	nextNode uint64      // the last node id given out (faultAddNode)
	// decommissioned: the nodes faultDecommission picked (only the fault
	// loop uses it).
	decommissioned map[uint64]bool
	// followers are one client per data region (cp.regions' order) that
	// prefers followers for snapshot reads (DESIGN.md §13).
	followers []*client.DB
}

// workload is one kind of client load and its checker.
type workload interface {
	// run starts the workload's clients on dbs (one per data region, in
	// cp.regions' order) under wg; they stop when ctx ends.
	run(ctx context.Context, dbs []*client.DB, wg *sync.WaitGroup)
	// final reads the database's state after the faults are healed.
	final(ctx context.Context, db *client.DB)
	// check reports anomalies in what the clients saw.
	check()
	// dump writes the workload's history into dir after an anomaly.
	dump(dir string) error
}

// count adds one operation of kind what to the summary.
func (cp *campaign) count(what string) {
	cp.mu.Lock()
	cp.sum.Ops[what]++
	cp.mu.Unlock()
}

// countOutcome counts an operation of kind what by err's outcome and returns it.
func (cp *campaign) countOutcome(what string, err error) outcome {
	o := outcomeOf(err)
	cp.count(what + " " + o.String())
	return o
}

func (cp *campaign) anomaly(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	// As it happens, for whoever watches a long campaign; at: seconds since
	// it began, as in the summary's timeline.
	slog.Error("nemesis: anomaly", "what", msg, "at", fmt.Sprintf("%.3f s", time.Since(cp.start).Seconds()))
	cp.mu.Lock()
	cp.sum.Anomalies = append(cp.sum.Anomalies, msg)
	cp.mu.Unlock()
}

// now is the time since the campaign began, in ns: histories' clock.
func (cp *campaign) now() int64 { return time.Since(cp.start).Nanoseconds() }

// key returns name homed in data region i mod the number of them (under the
// first range prefix of the region's YCSB key space).
func (cp *campaign) key(i int, name string) []byte {
	return append(append([]byte{}, cp.keys[i%len(cp.keys)].Prefixes[0]...), name...)
}

// outcome is what a client was told about an operation.
type outcome uint8

const (
	committed outcome = iota
	unknown
	failed
)

func (o outcome) String() string {
	return [...]string{"committed", "outcome unknown", "failed"}[o]
}

func outcomeOf(err error) outcome {
	switch {
	case err == nil:
		return committed
	case errors.Is(err, client.ErrCommitUnknown):
		return unknown
	}
	return failed
}

// never is the return time of an operation whose outcome is unknown.
const never = 1 << 62

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
	top, err := withSpareNodes(cfg.Topology)
	if err != nil {
		return nil, err
	}
	cfg.Topology = top
	dir, err := os.MkdirTemp("", "terroir-nemesis-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	c, err := localcluster.Start(cfg.Topology, localcluster.Options{DataDir: dir, Keep: true, OrphanAfter: orphanAfter, TxnRecordGrace: txnRecordGrace, Crashable: true,
		ReplicaGCInterval: replicaGCInterval})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cp := &campaign{cfg: cfg, c: c, start: time.Now(), decommissioned: map[uint64]bool{}, sum: &Summary{Seed: cfg.Seed, Ops: map[string]int{},
		Faults: map[string]int{}, Recovery: map[string]*latency.Histogram{}, Released: latency.New()}}
	for _, n := range cfg.Topology.Nodes {
		cp.nextNode = max(cp.nextNode, n.ID)
	}
	if err := cp.orderRegions(); err != nil {
		return nil, err
	}
	dbs := make([]*client.DB, len(cp.regions))
	for i, r := range cp.regions {
		if dbs[i], err = c.Client(r); err != nil {
			return nil, err
		}
		dbs[i].SetCrashHook(cp.crashHook)
	}
	epochs, err := newEpochMonitor(cp)
	if err != nil {
		return nil, err
	}
	bank := newBank(cp)
	if err := bank.fund(ctx, dbs[0]); err != nil {
		return nil, err
	}
	if err := cp.addNonVoters(ctx, dbs[0]); err != nil {
		return nil, err
	}
	if cp.followers, err = cp.followerClients(); err != nil {
		return nil, err
	}
	workloads := []workload{newTxnGroups(cp), bank, newLongSnapshots(cp, bank), newChangefeeds(cp, bank), newRegisters(cp), newLists(cp), epochs}

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var wg sync.WaitGroup
	for _, w := range workloads {
		w.run(runCtx, dbs, &wg)
	}
	cp.faults(runCtx, dbs)
	wg.Wait()
	for _, db := range dbs {
		db.SetCrashHook(nil)
	}
	c.Dialer(cp.regions[0]).Network().Heal()
	for _, w := range workloads {
		w.final(ctx, dbs[0])
	}
	cp.checkPlacement(ctx, dbs[0])
	cp.drainLocks()
	cp.checkReplicas()
	for _, w := range workloads {
		w.check()
	}
	if len(cp.sum.Anomalies) > 0 {
		return cp.sum, cp.dump(workloads)
	}
	return cp.sum, nil
}

// orderRegions lists the data regions, ordered by their keys: the txn
// groups' model keys must sort as the real ones do.
func (cp *campaign) orderRegions() error {
	type region struct {
		name string
		keys ycsb.KeySpace
	}
	var rs []region
	for _, r := range cp.cfg.Topology.Regions {
		if ks, err := ycsb.RegionKeys(cp.cfg.Topology, r); err == nil {
			rs = append(rs, region{r, ks})
		}
	}
	if len(rs) == 0 {
		return errors.New("nemesis: the topology has no data region")
	}
	sort.Slice(rs, func(a, b int) bool { return string(rs[a].keys.Prefixes[0]) < string(rs[b].keys.Prefixes[0]) })
	for _, r := range rs {
		cp.regions, cp.keys = append(cp.regions, r.name), append(cp.keys, r.keys)
	}
	return nil
}

// dump writes every workload's history, the seed and the recent log
// (cfg.Log) into cfg.Out, and returns the error Run reports.
func (cp *campaign) dump(workloads []workload) error {
	err := fmt.Errorf("nemesis: %d anomalies (seed %d)", len(cp.sum.Anomalies), cp.cfg.Seed)
	if cp.cfg.Out == "" {
		return err
	}
	if mkErr := os.MkdirAll(cp.cfg.Out, 0o755); mkErr != nil {
		return errors.Join(err, mkErr)
	}
	errs := []error{err}
	for _, w := range workloads {
		errs = append(errs, w.dump(cp.cfg.Out))
	}
	seed := fmt.Sprintf("seed %d\nfaults: %q\nanomalies:\n", cp.cfg.Seed, cp.cfg.Faults)
	for _, a := range cp.sum.Anomalies {
		seed += "  " + a + "\n"
	}
	errs = append(errs, os.WriteFile(filepath.Join(cp.cfg.Out, "seed.txt"), []byte(seed), 0o644))
	if cp.cfg.Log != nil {
		errs = append(errs, os.WriteFile(filepath.Join(cp.cfg.Out, "log.txt"), []byte(strings.Join(cp.cfg.Log.Lines(), "")), 0o644))
	}
	return errors.Join(errs...)
}

// Write prints the summary.
func (s *Summary) Write(w io.Writer) {
	fmt.Fprintf(w, "seed %d\n\noperations:\n", s.Seed)
	for _, k := range sortedKeys(s.Ops) {
		fmt.Fprintf(w, "  %-52s %d\n", k, s.Ops[k])
	}
	fmt.Fprintf(w, "\nfaults injected, and recovery (from healing until every data region committed again):\n")
	for _, k := range sortedKeys(s.Faults) {
		line := fmt.Sprintf("  %-88s %d", k, s.Faults[k])
		if h := s.Recovery[k]; h != nil && h.Count() > 0 {
			line += fmt.Sprintf("   recovery p50 %s max %s", latency.MS(h.Quantile(50)), latency.MS(h.Quantile(100)))
		}
		fmt.Fprintln(w, line)
	}
	if s.Released != nil && s.Released.Count() > 0 {
		fmt.Fprintf(w, "\ntransactions caught mid-commit: %d, locks released p50 %s max %s after the kill\n",
			s.Released.Count(), latency.MS(s.Released.Quantile(50)), latency.MS(s.Released.Quantile(100)))
	}
	fmt.Fprintf(w, "epoch reads checked: %d\n", s.EpochReads)
	fmt.Fprintf(w, "quorum checks (every group has a majority of its voters running once a fault is healed): %d\n", s.QuorumChecks)
	fmt.Fprintf(w, "\nanomalies: %d\n", len(s.Anomalies))
	for _, a := range s.Anomalies {
		fmt.Fprintf(w, "  %s\n", a)
	}
	if len(s.Anomalies) == 0 {
		return
	}
	fmt.Fprintf(w, "\nfaults in order (s since the campaign began):\n")
	for _, e := range s.Timeline {
		switch {
		case !e.Struck:
			fmt.Fprintf(w, "  %8.3f  %s: did not strike (nothing to strike, or it failed)\n", e.Began.Seconds(), e.Kind)
		case e.Healed == 0:
			fmt.Fprintf(w, "  %8.3f  %s: not healed\n", e.Began.Seconds(), e.Kind)
		default:
			fmt.Fprintf(w, "  %8.3f  %s: healed at %.3f\n", e.Began.Seconds(), e.Kind, e.Healed.Seconds())
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
