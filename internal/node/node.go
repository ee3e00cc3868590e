// Package node is one Terroir node process: it opens the node's Pebble store,
// hosts its replicas of every group the topology places on it, and serves them
// over gRPC (DESIGN.md §2).
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/terroir-db/terroir/internal/console"
	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/rangeserver"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/rebalance"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
	"github.com/terroir-db/terroir/internal/txnstate"
)

// Config says which node to run and where.
type Config struct {
	// Topology is the cluster; NodeID must be one of its nodes.
	Topology *topology.Topology
	// NodeID is this node's ID.
	NodeID uint64
	// DataDir holds the node's Pebble store.
	DataDir string
	// Network models the WAN between regions; nil means the topology's latencies
	// with no faults (a stand-alone process).
	Network *transport.Network
	// Listener, if set, is used instead of listening on the node's address. The
	// node owns it from Start on, and closes it even when Start fails.
	Listener net.Listener
	// Registry receives the node's metrics; nil means a fresh registry.
	Registry *prometheus.Registry
	// CompactAfter overrides raftgroup.Config.CompactAfter (0: default).
	CompactAfter uint64
	// OrphanAfter overrides the topology's orphan_after for this node's range
	// leaders (0: the topology's). Coordinators heartbeat at the topology's
	// value / 4, so an override below a quarter of it drops live transactions.
	OrphanAfter time.Duration
	// Certs are the node's certificates (security.LoadNode): every connection
	// in and out is mutual TLS with them (DESIGN.md §15). Nil with Insecure set
	// means plaintext; nil without Insecure is an error.
	Certs *security.Certs
	// Insecure runs the node without TLS or authorization, an explicit choice
	// (`terroir start --insecure`).
	Insecure bool
	// HTTPAddr is where the node serves /metrics, /healthz, /readyz and the
	// web console ("": not at all; port 0: any free port). Start fails when
	// it cannot be bound.
	HTTPAddr string
	// CacheSize is the store's block cache in bytes (0:
	// storage.DefaultCacheSize; `terroir start --cache`).
	CacheSize int64
	// Pprof also serves Go's profiles (CPU, heap, goroutines) under
	// /debug/pprof/ on HTTPAddr, for an operator diagnosing a slow node
	// (`terroir start --pprof`). Off by default: a CPU profile costs the
	// node while it runs, and the heap profile names code paths.
	Pprof bool
	// RebalanceInterval overrides the topology's rebalance_interval: how
	// often the region's replicate queue plans, on the node leading its
	// region's directory (0: the topology's; below 0: never, for tests
	// that place replicas themselves).
	RebalanceInterval time.Duration
	// ReplicaGCInterval: how often the node looks for replicas of its own
	// that a change left out while it was down (replicagc.go; 0: every
	// 10 s; below 0: never).
	ReplicaGCInterval time.Duration
	// Addr, if set, is the node's RPC address instead of the topology's:
	// a node of the file restarted elsewhere; the registry records it
	// (DESIGN.md §12). The topology, which seeds the registry, stays as
	// every node has it.
	Addr string
	// Crashable opens the store so that Kill can lose what a power loss
	// would (storage.OpenCrashable); for fault campaigns.
	Crashable bool
}

// Node is a running node. Close stops it.
type Node struct {
	cfg        Config
	engine     *storage.Engine
	host       *raftgroup.Host
	dialer     *transport.Dialer
	raft       *transport.Raft
	server     *transport.Server
	listener   net.Listener
	groups     map[uint64]*hostedGroup  // the non-range groups hosted here (groups.go), under mu
	groupMoves sync.Map                 // group ID → struct{}: the moves this node leads, one per group
	dropping   map[uint64]chan struct{} // groups being dropped (closed once gone), under mu
	hosting    sync.Mutex               // one AddGroupReplica at a time (a duplicated call must not undo the first)
	epochSrv   *epoch.Server
	rangeSrv   *rangeserver.Server
	side       *rangeserver.SideTransport // idle ranges' closes to their other replicas
	txnSrv     *txnstate.Server
	dirSrv     *directory.Server
	dirs       *directory.Directories // every region's directory, for splits' IDs and descriptor changes
	stop       context.CancelFunc     // ends publishing and reconciling
	stopped    context.Context
	bg         sync.WaitGroup // descriptor publishing and the reconciliation loop
	mu         sync.Mutex
	ranges     []*rangeserver.Replica   // grows when a split creates a range here
	readers    map[string]*epoch.Reader // epoch and publisher readers, by kind/region
	deciders   map[uint64]*txnstate.Client
	gcPolicies map[string]*gcPolicy // by region, for the range leaders' GC
	closing    bool                 // no range is added once Close began
	removing   sync.WaitGroup       // replicas of merged-away ranges being removed
	// removingRanges: range replicas being removed (their spans' data
	// not deleted yet), by range ID, under mu.
	removingRanges map[uint64]*pb.RangeDescriptor
	registry       *prometheus.Registry
	metrics        *metrics
	started        time.Time
	http           *http.Server // nil unless Config.HTTPAddr is set
	httpListener   net.Listener
	httpDone       chan struct{}
	console        *console.Console
	served         chan struct{}
	dropLookup     func() // takes the registry lookup out of the network
	queue          *rebalance.Queue
	queueRegion    *regionCluster
}

// Start opens the store, recovers every hosted replica and starts serving.
// Errors wrap storage.ErrCorrupt for a damaged data directory and
// storage.ErrWrongNode for another node's.
func Start(cfg Config) (_ *Node, err error) {
	top := cfg.Topology
	self, ok := top.Node(cfg.NodeID)
	if !ok {
		return nil, fmt.Errorf("node: node %d is not in the topology", cfg.NodeID)
	}
	if cfg.Certs == nil && !cfg.Insecure {
		return nil, fmt.Errorf("node: %w: node %d has no certificates (start it with --certs-dir, or --insecure for a plaintext cluster)", security.ErrNoCerts, cfg.NodeID)
	}
	if cfg.Certs != nil {
		if id := cfg.Certs.Identity(); !id.IsNode() || id.Node != cfg.NodeID || id.Region != self.Region {
			return nil, fmt.Errorf("node: %w: %s names %s, but this is node %d (%s)", security.ErrBadCert, cfg.Certs.CertPath(), id, cfg.NodeID, self.Region)
		}
	}
	if cfg.Network == nil {
		cfg.Network = transport.NewNetwork(top)
	}
	if cfg.Addr != "" {
		cfg.Network.SetNodes([]topology.Node{{ID: cfg.NodeID, Region: self.Region, Addr: cfg.Addr}})
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	n := &Node{cfg: cfg, groups: map[uint64]*hostedGroup{}, dropping: map[uint64]chan struct{}{}, removingRanges: map[uint64]*pb.RangeDescriptor{}, registry: cfg.Registry, served: make(chan struct{}),
		readers: map[string]*epoch.Reader{}, deciders: map[uint64]*txnstate.Client{}, gcPolicies: map[string]*gcPolicy{}}
	n.stopped, n.stop = context.WithCancel(context.Background())
	n.started = time.Now()
	n.metrics = newMetrics(cfg.Registry, n)
	defer func() {
		if err != nil {
			n.closeParts()
		}
	}()
	if n.engine, err = storage.OpenWith(cfg.DataDir, cfg.NodeID, storage.Options{CacheSize: cfg.CacheSize, Crashable: cfg.Crashable}); err != nil {
		return nil, err
	}
	n.host = raftgroup.NewHost(cfg.NodeID, n.engine,
		raftgroup.Config{Tick: top.RaftTick, CompactAfter: cfg.CompactAfter,
			Known: func(id uint64) bool { _, ok := cfg.Network.Node(id); return ok }},
		raftgroup.NewMetrics(cfg.Registry))
	n.dialer = transport.NewDialer(cfg.Network, transport.Endpoint{Node: cfg.NodeID, Region: self.Region}, cfg.Certs)
	n.dirs = directory.NewDirectories(top, n.dialer)
	n.dropLookup = cfg.Network.AddLookup(n.dirs.RegisteredNodes)
	removed, err := n.removedRanges()
	if err != nil {
		return nil, err
	}
	n.epochSrv, n.txnSrv, n.dirSrv = epoch.NewServer(), txnstate.NewServer(), directory.NewServer(top.LivenessTimeout)
	n.epochSrv.ObserveRounds(n.metrics.observeRound)
	n.rangeSrv = rangeserver.NewServer()
	n.side = rangeserver.NewSideTransport(cfg.NodeID, sideGather, n.sendSideClosed)
	if err := n.hostGroups(); err != nil {
		return nil, err
	}
	var moved []uint64 // ranges whose removal was cut short
	for _, g := range top.GroupsOn(cfg.NodeID) {
		switch g.Kind {
		case topology.KindRange:
			if removed[g.ID] {
				continue // merged away
			}
			if _, err := n.addRange(routing.BootstrapDescriptor(g), false, false); err != nil {
				if errors.Is(err, errNotNamed) { // moved away; its removal was cut short
					moved = append(moved, g.ID)
					continue
				}
				return nil, err
			}
		}
	}

	// Ranges that splits created here since bootstrap.
	split, err := n.engine.IndexedRanges()
	if err != nil {
		return nil, err
	}
	for _, id := range split {
		if n.Range(id) != nil || removed[id] || slices.Contains(moved, id) {
			continue
		}
		if _, err := n.addRange(&pb.RangeDescriptor{RangeId: id}, false, false); err != nil {
			if errors.Is(err, errNotNamed) { // moved away, or added but its first snapshot never came
				moved = append(moved, id)
				continue
			}
			return nil, err
		}
	}
	// Dropped once every hosted range is open: their spans are kept.
	for _, id := range moved {
		if err := n.dropMoved(id); err != nil {
			return nil, err
		}
	}

	// Bound before anything serves: a Status RPC reads HTTPAddr, and an
	// address in use stops the node before it serves at all.
	if cfg.HTTPAddr != "" {
		if n.httpListener, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return nil, fmt.Errorf("node %d: serve metrics and the console on %s: %w (choose another with --http-addr)", cfg.NodeID, cfg.HTTPAddr, err)
		}
	}
	n.raft = transport.NewRaft(n.dialer, n.host)
	n.server = transport.NewServer(cfg.Certs, n.metrics.unary)
	n.raft.Register(n.server)
	n.epochSrv.Register(n.server)
	n.txnSrv.Register(n.server)
	n.dirSrv.Register(n.server)
	n.rangeSrv.Register(n.server)
	(&statusServer{n: n}).register(n.server)

	n.listener = cfg.Listener
	if n.listener == nil {
		if n.listener, err = net.Listen("tcp", n.addr()); err != nil {
			return nil, fmt.Errorf("node %d: listen on %s: %w", cfg.NodeID, n.addr(), err)
		}
	}
	go func() {
		defer close(n.served)
		if err := n.server.Serve(n.listener); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			slog.Error("grpc server stopped", "node", cfg.NodeID, "err", err)
		}
	}()
	ranges := n.rangeReplicas() // a split applied from now on starts its own
	n.host.Start(n.raft)
	for _, h := range n.hostedGroups() {
		if h.rg.StartLeader() == cfg.NodeID {
			h.rg.LeadAtStart()
		}
		h.start()
	}
	for _, r := range ranges {
		r.LeadAtStart()
		r.Start()
	}
	if n.httpListener != nil {
		n.serveHTTP()
	}
	n.bg.Add(3)
	go n.reconcile()
	go func() {
		defer n.bg.Done()
		n.keepRegistered()
	}()
	go func() {
		defer n.bg.Done()
		n.refreshBook()
	}()
	every := cmp.Or(cfg.RebalanceInterval, top.RebalanceInterval)
	// Every node runs its region's queue; it plans only while the node
	// leads the region's directory, wherever moves took that group.
	if every > 0 && len(top.GroupsOfKind(topology.KindDirectory, self.Region)) > 0 {
		n.queueRegion = &regionCluster{n: n, region: self.Region}
		n.queue = rebalance.NewQueue(n.queueRegion, rebalance.QueueConfig{Interval: every, AutoRehomeAfter: top.AutoRehomeAfter,
			Config: rebalance.Config{ReplaceAfter: top.ReplaceAfter, MaxMoves: top.MaxSnapshots, MergeSize: top.MergeSize, MergeQPS: top.MergeQPS,
				AutoRehome: top.AutoRehomeAfter > 0}})
		n.background(func() { n.queue.Run(n.stopped) })
	}
	if gcEvery := cmp.Or(cfg.ReplicaGCInterval, defaultReplicaGCInterval); gcEvery > 0 {
		n.background(func() { n.collectReplicas(self.Region, gcEvery) })
	}
	n.background(func() { n.cleanTxnRecords(n.txnSrv, self.Region) })
	slog.Info("node started", "node", cfg.NodeID, "region", self.Region, "addr", n.listener.Addr().String(), "groups", len(top.GroupsOn(cfg.NodeID)))
	return n, nil
}

// addRange opens this node's replica of the range that seed describes (its
// stored descriptor, once it has one, supersedes seed) and makes it
// reachable, starting it if start is set. A joining replica (a learner a
// move adds) starts with no Raft configuration, until the leader's
// snapshot brings one. Each replica learns of the range's splits through
// onSplit. A descriptor that does not name this node fails with
// errNotNamed; once Close began it fails with raftgroup.ErrStopped.
func (n *Node) addRange(seed *pb.RangeDescriptor, start, joining bool) (*rangeserver.Replica, error) {
	top := n.cfg.Topology
	sm, err := rangeserver.NewStateMachine(n.engine, seed)
	if err != nil {
		return nil, err
	}
	d := sm.Descriptor()
	if !named(d, n.cfg.NodeID) {
		// Still a member while a joint change that removes it is under way.
		if cs, err := raftgroup.StoredConf(n.engine, d.GetRangeId()); err != nil || !raftgroup.InConf(cs, n.cfg.NodeID) {
			return nil, fmt.Errorf("node %d: range %d (replicas %v, learners %v, non-voters %v): %w", n.cfg.NodeID, d.GetRangeId(), d.GetReplicas(), d.GetLearners(), d.GetNonVoters(), errNotNamed)
		}
	}
	voters := d.GetReplicas()
	if joining {
		voters = nil
	}
	home, err := n.homeOf(d.GetRegion())
	if err != nil {
		return nil, err
	}
	rg, err := n.host.AddGroupWithLearners(d.GetRangeId(), voters, d.GetNonVoters(), sm)
	if err != nil {
		return nil, err
	}
	r := rangeserver.NewReplica(n.cfg.NodeID, rg, sm, home, n.decider,
		rangeserver.Config{Tick: rangeTick(top), EpochInterval: top.LocalEpochInterval, LeaseEpochs: top.RangeLeaseEpochs, LeaseRenewEpochs: top.RangeLeaseRenewEpochs, OrphanAfter: cmp.Or(n.cfg.OrphanAfter, top.OrphanAfter), QuietEpochs: top.QuietEpochs,
			SplitSize: top.SplitSize, SplitQPS: top.SplitQPS, MergeSize: top.MergeSize, MergeQPS: top.MergeQPS, MergeDelay: top.MergeDelay, GCTTL: top.GCTTL, ClosedInterval: top.ClosedEpochInterval,
			Sibling: n.rangeSrv.Sibling, PeerDescriptor: n.peerDescriptor, PeerTransferLease: n.peerTransferLease,
			SideClose: n.side.Send, LockWait: n.metrics.lockWait, CommitStages: n.metrics.commitStages(), EpochsReadAhead: n.metrics.readAhead, ClosedLag: n.metrics.closedLag, Closes: [2]prometheus.Counter{n.metrics.closes.WithLabelValues("log"), n.metrics.closes.WithLabelValues("side")}, AddReplica: n.addReplica, RemoveReplica: n.removeRemote,
			Region: n.dialer.Self().Region, HomeOf: n.homeOf, PickVoters: n.pickVoters, Rehomed: n.writeRehomed})
	sm.OnSplit(n.onSplit)
	sm.OnMerge(n.onMerge)
	sm.OnReplicasChanged(n.onReplicasChanged)
	// A configuration that leaves this replica out with no descriptor
	// change of its own (the end of a joint change that removed it: a
	// rehome's old leader, DESIGN.md §13) drops it too.
	rg.OnLeft(func() {
		if r := n.Range(d.GetRangeId()); r != nil {
			n.removeReplica(r)
		}
	})
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closing {
		return nil, raftgroup.ErrStopped // the host stops the group
	}
	n.ranges = append(n.ranges, r)
	n.rangeSrv.Add(r)
	if start {
		r.Start()
	}
	return r, nil
}

// onSplit starts this node's replica of the right-hand range of a split, once
// the split is durable here (DESIGN.md §11). The leaseholder's replica calls
// the new group's first election, so leadership and lease stay on one node,
// and inherits the left-hand leader's highest epoch.
func (n *Node) onSplit(s rangeserver.Split) {
	var in rangeserver.Inheritance
	if left := n.Range(s.Left.GetRangeId()); left != nil {
		in = left.HandOver(s.Right.GetRangeId())
		if left.LeaderHint() == n.cfg.NodeID {
			n.publish(s.Left, s.Right)
		}
	}
	if n.Range(s.Right.GetRangeId()) != nil {
		return
	}
	r, err := n.addRange(s.Right, true, false)
	if err != nil {
		if !errors.Is(err, raftgroup.ErrStopped) {
			slog.Error("node: starting the right-hand range of a split", "node", n.cfg.NodeID, "range", s.Right.GetRangeId(), "err", err)
		}
		return
	}
	// Before its first election is done (a later one only means the new
	// leader waits for the global epoch, and the handed locks are lost).
	r.Inherit(in)
	if r.LeaseHolder() == n.cfg.NodeID {
		r.Campaign()
	}
}

// onMerge removes this node's replica of the range a merge subsumed, once
// the merge is durable here (DESIGN.md §11): the replica stops, and its Raft
// and range-local state are deleted. The store's tombstone for the range,
// written with the merge, keeps the node from hosting it again.
func (n *Node) onMerge(m rangeserver.Merge) {
	id := m.Right.GetRangeId()
	if left := n.Range(m.Merged.GetRangeId()); left != nil && left.LeaderHint() == n.cfg.NodeID {
		n.publish(m.Merged, m.Right)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	i := slices.IndexFunc(n.ranges, func(r *rangeserver.Replica) bool { return r.ID() == id })
	if i < 0 || n.closing {
		return
	}
	r := n.ranges[i]
	n.ranges = slices.Delete(n.ranges, i, i+1)
	n.rangeSrv.Remove(id)
	n.removing.Add(1)
	go func() { // not on the merged range's apply loop: stopping r waits for its loop
		defer n.removing.Done()
		r.Close()
		if err := n.dropRange(id); err != nil {
			slog.Error("node: removing a merged range's replica", "node", n.cfg.NodeID, "range", id, "err", err)
		}
	}()
}

// dropRange deletes range id's Raft group and range-local state.
func (n *Node) dropRange(id uint64) error {
	if err := n.host.RemoveGroup(id); err != nil {
		return err
	}
	return n.engine.DeleteState(id)
}

// removedRanges returns the ranges merged away on this store, deleting
// what a removal cut short by a crash left of them.
func (n *Node) removedRanges() (map[uint64]bool, error) {
	ids, err := n.engine.RemovedRanges()
	if err != nil {
		return nil, err
	}
	removed := map[uint64]bool{}
	for _, id := range ids {
		removed[id] = true
		if err := n.dropRange(id); err != nil {
			return nil, err
		}
	}
	return removed, nil
}

// peerDescriptor asks node for its descriptor of range id
// (rangeserver.Config.PeerDescriptor).
func (n *Node) peerDescriptor(ctx context.Context, node, id uint64) (*pb.RangeDescriptor, error) {
	conn, err := n.dialer.Conn(node)
	if err != nil {
		return nil, err
	}
	resp, err := pb.NewRangeClient(conn).Ranges(ctx, &pb.RangesRequest{})
	if err != nil {
		return nil, err
	}
	for _, st := range resp.GetRanges() {
		if d := st.GetRangeDescriptor(); d.GetRangeId() == id {
			return d, nil
		}
	}
	return nil, nil
}

// peerTransferLease asks node's replica of range id to hand its lease to
// node `to` (rangeserver.Config.PeerTransferLease).
func (n *Node) peerTransferLease(ctx context.Context, node, id, to uint64) error {
	conn, err := n.dialer.Conn(node)
	if err != nil {
		return err
	}
	_, err = pb.NewRangeClient(conn).TransferLease(ctx, &pb.TransferLeaseRequest{RangeId: id, Target: to})
	return err
}

// sideGather is how long the side transport gathers closes into one RPC
// per peer: the ranges' ticks are aligned, so one tick's closes of every
// range a node leads come within it, and a follower read waiting for a
// close waits little more.
const sideGather = 2 * time.Millisecond

// HoldSideClosed makes the node's side-transported closes wait d before
// they are sent (0: no wait), to deliver them late: a nemesis fault
// (rangeserver.SideTransport.Hold).
func (n *Node) HoldSideClosed(d time.Duration) { n.side.Hold(d) }

// sendSideClosed sends idle ranges' closes to node
// (rangeserver.SideTransport).
func (n *Node) sendSideClosed(ctx context.Context, node uint64, req *pb.SideClosedRequest) error {
	conn, err := n.dialer.Multiplexed(node) // a message on the node's Multiplex stream
	if err != nil {
		return err
	}
	_, err = pb.NewRangeClient(conn).SideClosed(ctx, req)
	return err
}

// RangeIDs returns the IDs of the ranges the node hosts, as hosted.
func (n *Node) RangeIDs() []uint64 {
	var ids []uint64
	for _, r := range n.rangeReplicas() {
		ids = append(ids, r.ID())
	}
	return ids
}

// rangeReplicas returns the node's range replicas.
func (n *Node) rangeReplicas() []*rangeserver.Replica {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.ranges)
}

// reader returns the node's reader of region's group of kind (a local epoch
// group or a publisher), shared by the node's replicas. A local epoch
// group's reader reads the region's publisher, if it has one, in joint
// rounds (epoch.Reader.Pair): a range leader's commit reads both.
func (n *Node) reader(kind topology.Kind, region string) (*epoch.Reader, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.readerLocked(kind, region)
}

// readerLocked is reader, n.mu held.
func (n *Node) readerLocked(kind topology.Kind, region string) (*epoch.Reader, error) {
	key := string(kind) + "/" + region
	if r, ok := n.readers[key]; ok {
		return r, nil
	}
	groups := n.cfg.Topology.GroupsOfKind(kind, region)
	if len(groups) == 0 {
		return nil, fmt.Errorf("node: region %q has ranges but no %s group", region, kind)
	}
	r := epoch.NewReader(n.dialer, groups[0])
	r.ServeLocally(n.cfg.NodeID, n.epochSrv.ReadEpoch) // this node's replica answers in process
	if kind == topology.KindLocalEpoch {
		if pub, err := n.readerLocked(topology.KindPublisher, region); err == nil {
			r.Pair(pub)
		}
	}
	n.readers[key] = r
	return r, nil
}

// readerStats returns what each of the node's epoch readers did, by
// "kind/region" (the readers' key).
func (n *Node) readerStats() map[string]epoch.ReaderStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]epoch.ReaderStats, len(n.readers))
	for key, r := range n.readers {
		out[key] = r.Stats()
	}
	return out
}

// decider returns a client of txn-state group id (nil if the topology has none).
func (n *Node) decider(id uint64) rangeserver.Decider {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.deciders[id]; ok {
		return c
	}
	g, ok := n.cfg.Topology.Group(id)
	if !ok || g.Kind != topology.KindTxnState {
		return nil
	}
	c := txnstate.NewClient(n.dialer, g)
	n.deciders[id] = c
	return c
}

// Range returns the node's replica of range id, or nil.
func (n *Node) Range(id uint64) *rangeserver.Replica {
	for _, r := range n.rangeReplicas() {
		if r.ID() == id {
			return r
		}
	}
	return nil
}

// Addr returns the address the node serves on.
func (n *Node) Addr() string { return n.listener.Addr().String() }

// DataStats measures the MVCC data (every range's versions, not the
// regional copies) this node stores (storage.Engine.MVCCStats: a full scan).
func (n *Node) DataStats() (storage.MVCCStats, error) {
	return n.engine.MVCCStats([]byte{storage.PrefixData})
}

// Group returns the node's replica of group id, or nil.
// QueueStats returns what this node's replicate queue did so far
// (rebalance.Stats), and false if the node runs none (no region queue).
func (n *Node) QueueStats() (rebalance.Stats, bool) {
	if n.queue == nil {
		return rebalance.Stats{}, false
	}
	return n.queue.Stats(), true
}

func (n *Node) Group(id uint64) *raftgroup.Group { return n.host.Group(id) }

// EpochReplica returns the node's replica of local epoch group id, or nil.
func (n *Node) EpochReplica(id uint64) *epoch.Replica {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h := n.groups[id]; h != nil {
		return h.local
	}
	return nil
}

// Close stops serving, stops every replica and closes the store (Pebble writes
// out its WAL on close, so this is a clean stop; abrupt kills are tested with
// separate processes and SIGKILL).
func (n *Node) Close() error {
	return n.closeParts()
}

// HoldSyncs stalls the node's store as a disk whose flushes hang: its
// fsyncs wait until the hold's Release, or the node's Kill (storage.SyncHold).
// For fault campaigns: nil unless the node runs with Config.Crashable.
func (n *Node) HoldSyncs() *storage.SyncHold { return n.engine.HoldSyncs() }

// Kill stops the node and leaves its store as a power loss would, losing
// every write not yet synced (with Config.Crashable; otherwise it is Close).
// The caller isolates the node first (transport.Network.Kill), so nothing it
// does while stopping is seen: to the cluster it died at that instant.
func (n *Node) Kill() error {
	if n.engine != nil {
		n.engine.Crash()
	}
	return n.closeParts()
}

func (n *Node) closeParts() error {
	n.mu.Lock()
	n.closing = true
	n.mu.Unlock()
	n.stop()      // first: ends the console's status requests (their base context)
	n.closeHTTP() // before the dialer they use closes
	if n.dropLookup != nil {
		n.dropLookup()
	}
	n.bg.Wait()
	if n.queueRegion != nil {
		n.queueRegion.close()
	}
	for _, r := range n.rangeReplicas() {
		r.Close()
	}
	n.removing.Wait()
	if n.side != nil {
		n.side.Close() // after the replicas that send through it, before the dialer
	}
	n.hosting.Lock() // a group being added is started before it is closed
	for _, h := range n.hostedGroups() {
		h.close()
	}
	n.hosting.Unlock()
	n.mu.Lock()
	readers := slices.Collect(maps.Values(n.readers))
	n.mu.Unlock()
	for _, r := range readers {
		r.Close()
	}
	if n.server != nil {
		n.server.Stop()
		if n.listener != nil {
			<-n.served
		}
	} else if n.listener != nil {
		_ = n.listener.Close()
	} else if n.cfg.Listener != nil {
		_ = n.cfg.Listener.Close() // failed before taking the listener over
	}
	if n.raft != nil {
		n.raft.Close()
	}
	if n.host != nil {
		n.host.Close()
	}
	if n.dialer != nil {
		n.dialer.Close()
	}
	if n.engine != nil {
		return n.engine.Close()
	}
	return nil
}

// rangeTick is how often a range replica checks its lease: every five local
// epochs (50 ms by default), far inside the lease's renewal margin (half of
// 100 epochs), and seldom enough that idle ranges cost little.
func rangeTick(top *topology.Topology) time.Duration { return 5 * top.LocalEpochInterval }

// addr is the node's RPC address: Config.Addr, else the topology's.
func (n *Node) addr() string {
	self, _ := n.cfg.Topology.Node(n.cfg.NodeID)
	return cmp.Or(n.cfg.Addr, self.Addr)
}
