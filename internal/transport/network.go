// Package transport carries every message between Terroir processes over real gRPC
// sockets: batched Raft messages between nodes and unary RPCs from clients and nodes.
// It also injects the wide-area network (DESIGN.md §8): every message that crosses
// regions is delayed by half the configured round trip, in order per connection,
// and tests cut off nodes or regions, drop or delay messages at the same layer.
package transport

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/topology"
)

// Endpoint is one side of a message: a node, or a client (Node 0) in a region.
type Endpoint struct {
	// Node is the node ID, or 0 for a client process.
	Node uint64
	// Region is the endpoint's region.
	Region string
}

// Network is the simulated wide-area network between endpoints: the topology's RTT
// matrix plus faults injected by tests. One Network is shared by every node and
// client of an in-process cluster; a stand-alone process has its own, with latency
// only. Its methods are safe for concurrent use.
type Network struct {
	top *topology.Topology

	mu         sync.RWMutex
	cutNodes   map[uint64]bool
	starved    map[uint64]bool // nodes no other node reaches; clients still do
	logStarved map[uint64]bool // nodes no other node's Raft messages or snapshots reach; RPCs still do
	dead       map[uint64]bool // killed nodes: cut until revived, whatever Heal does
	cutRegions map[string]bool
	dropRate   float64
	dupRate    float64
	extraDelay time.Duration
	rtt        map[[2]string]time.Duration // overrides of the topology's RTT
	detector   DetectorConfig              // failure detection of the dialers made on it (SetDetector)

	bookMu  sync.RWMutex
	book    map[uint64]topology.Node // every node's region and address: the topology's, then the registry's
	bookGen atomic.Uint64            // bumped when an address changes, so dialers redial

	lookupMu   sync.Mutex // one lookup at a time
	lookups    map[int]func(ctx context.Context) ([]topology.Node, error)
	nextLookup int
	lastLookup time.Time
}

// lookupEvery bounds how often a miss in the node book reads the registry;
// lookupTimeout bounds one read.
const (
	lookupEvery   = 500 * time.Millisecond
	lookupTimeout = 2 * time.Second
)

// AddLookup adds a way to read the node registry when a dialer meets a
// node the book does not know (one that joined after the process started):
// f returns every registered node. A miss tries each until one answers
// (every node and client of an in-process cluster adds its own; a closed
// one fails at once). remove takes f out again.
func (n *Network) AddLookup(f func(ctx context.Context) ([]topology.Node, error)) (remove func()) {
	n.lookupMu.Lock()
	defer n.lookupMu.Unlock()
	if n.lookups == nil {
		n.lookups = map[int]func(ctx context.Context) ([]topology.Node, error){}
	}
	id := n.nextLookup
	n.nextLookup++
	n.lookups[id] = f
	return func() {
		n.lookupMu.Lock()
		delete(n.lookups, id)
		n.lookupMu.Unlock()
	}
}

// lookUp reads the registry into the book, at most every lookupEvery and
// never from within a lookup (which dials too), and reports whether node id
// is known afterwards.
func (n *Network) lookUp(id uint64) bool {
	if !n.lookupMu.TryLock() {
		_, ok := n.Node(id) // another lookup may just have found it
		return ok
	}
	if time.Since(n.lastLookup) >= lookupEvery {
		n.lastLookup = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
		for _, f := range n.lookups {
			if nodes, err := f(ctx); err == nil {
				n.SetNodes(nodes)
				break
			}
		}
		cancel()
	}
	n.lookupMu.Unlock()
	_, ok := n.Node(id)
	return ok
}

// NewNetwork returns a fault-free network with top's latency matrix, whose
// node book starts as top's nodes.
func NewNetwork(top *topology.Topology) *Network {
	n := &Network{top: top, cutNodes: map[uint64]bool{}, starved: map[uint64]bool{}, logStarved: map[uint64]bool{}, dead: map[uint64]bool{}, cutRegions: map[string]bool{}, rtt: map[[2]string]time.Duration{},
		book: map[uint64]topology.Node{}}
	for _, nd := range top.Nodes {
		n.book[nd.ID] = nd
	}
	return n
}

// SetDetector sets the failure detection of every Dialer made on the
// network after it (zero fields: the defaults; Dialer.SetDetector still
// overrides it): a whole cluster's in one call, as an in-process test
// cluster under the race detector needs (localcluster).
func (n *Network) SetDetector(cfg DetectorConfig) {
	n.mu.Lock()
	n.detector = cfg
	n.mu.Unlock()
}

// detectorConfig returns what SetDetector set.
func (n *Network) detectorConfig() DetectorConfig {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.detector
}

// Node returns node id's region and address as the network knows them:
// the topology's, updated from the node registry (SetNodes).
func (n *Network) Node(id uint64) (topology.Node, bool) {
	n.bookMu.RLock()
	defer n.bookMu.RUnlock()
	nd, ok := n.book[id]
	return nd, ok
}

// Resolve returns node id's region and address, reading the registry
// (AddLookup) if the book does not know the node yet.
func (n *Network) Resolve(id uint64) (topology.Node, bool) {
	if nd, ok := n.Node(id); ok {
		return nd, true
	}
	n.lookUp(id)
	return n.Node(id)
}

// Nodes returns every node the network knows, by id.
func (n *Network) Nodes() []topology.Node {
	n.bookMu.RLock()
	defer n.bookMu.RUnlock()
	out := make([]topology.Node, 0, len(n.book))
	for _, nd := range n.book {
		out = append(out, nd)
	}
	slices.SortFunc(out, func(a, b topology.Node) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// SetNodes records nodes' regions and addresses (from the node registry,
// DESIGN.md §12): a node the network did not know becomes reachable, and
// dialers redial a node whose address changed.
func (n *Network) SetNodes(nodes []topology.Node) {
	n.bookMu.Lock()
	defer n.bookMu.Unlock()
	changed := false
	for _, nd := range nodes {
		if old, ok := n.book[nd.ID]; ok && old == nd {
			continue
		} else if ok && old.Addr != nd.Addr {
			changed = true
		}
		n.book[nd.ID] = nd
	}
	if changed {
		n.bookGen.Add(1)
	}
}

// OneWayDelay returns how long a message from one endpoint takes to reach the
// other: half the regions' RTT plus any injected extra delay; 0 within a region
// when no extra delay is injected.
func (n *Network) OneWayDelay(from, to Endpoint) time.Duration {
	n.mu.RLock()
	extra := n.extraDelay
	rtt, ok := n.rtt[regionPair(from.Region, to.Region)]
	n.mu.RUnlock()
	if !ok {
		rtt = n.top.RTT(from.Region, to.Region)
	}
	return rtt/2 + extra
}

func regionPair(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// SetRTT changes the round trip between regions a and b (a ≠ b) to rtt until
// Heal: a WAN that gets slower or faster while the cluster runs.
func (n *Network) SetRTT(a, b string, rtt time.Duration) {
	n.mu.Lock()
	n.rtt[regionPair(a, b)] = rtt
	n.mu.Unlock()
}

// Deliverable reports whether a message from one endpoint to the other gets
// through: false if the two are cut apart (cutLocked) or the message falls
// to the injected drop rate.
func (n *Network) Deliverable(from, to Endpoint) bool { return n.deliverable(from, to, false) }

// DeliverableRaft is Deliverable for a Raft message or snapshot: it is also
// false into a node whose log is starved (StarveLog).
func (n *Network) DeliverableRaft(from, to Endpoint) bool { return n.deliverable(from, to, true) }

func (n *Network) deliverable(from, to Endpoint, raft bool) bool {
	n.mu.RLock()
	cut, p := n.cutLocked(from, to, raft), n.dropRate
	n.mu.RUnlock()
	return !cut && (p == 0 || rand.Float64() >= p)
}

// CutRaft reports whether a Raft message or snapshot from one endpoint to
// the other is cut off, whatever the drop rate (cutLocked): the Raft
// stream drops what it queued before a cut began.
func (n *Network) CutRaft(from, to Endpoint) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.cutLocked(from, to, true)
}

// cutLocked reports, with n.mu held, whether the two endpoints are cut
// apart: either side is cut off or killed, the receiver is starved (of its
// log as well, for raft), or a region cut lies between them. A node is
// never cut from itself.
func (n *Network) cutLocked(from, to Endpoint, raft bool) bool {
	if from.Node != 0 && from.Node == to.Node {
		return false
	}
	if n.cutNodes[from.Node] || n.cutNodes[to.Node] || n.dead[from.Node] || n.dead[to.Node] {
		return true
	}
	if from.Node != 0 && (n.starved[to.Node] || raft && n.logStarved[to.Node]) {
		return true
	}
	return from.Region != to.Region && (n.cutRegions[from.Region] || n.cutRegions[to.Region])
}

// Duplicated reports whether a message that gets through is delivered a
// second time, by the injected duplication rate: a retransmission the
// receiver must tolerate.
func (n *Network) Duplicated() bool {
	n.mu.RLock()
	p := n.dupRate
	n.mu.RUnlock()
	return p > 0 && rand.Float64() < p
}

// CutNode isolates a node from every other endpoint until Heal.
func (n *Network) CutNode(id uint64) {
	n.mu.Lock()
	n.cutNodes[id] = true
	n.mu.Unlock()
}

// Starve cuts node id off from every other node's messages until Heal,
// while clients still reach it and it still reaches everyone: a replica
// that falls behind its group's log (no appends arrive) yet answers reads.
func (n *Network) Starve(id uint64) {
	n.mu.Lock()
	n.starved[id] = true
	n.mu.Unlock()
}

// StarveLog cuts node id off from every other node's Raft messages and
// snapshots until Heal, while every RPC still reaches it: its replicas
// fall behind their groups' logs yet hear what travels outside them (a
// side-transported close made at an index they have not applied, DESIGN.md
// §13) and answer reads.
func (n *Network) StarveLog(id uint64) {
	n.mu.Lock()
	n.logStarved[id] = true
	n.mu.Unlock()
}

// Kill isolates node id from every endpoint until Revive, whatever Heal does:
// the instant a node process dies, nothing more leaves or reaches it.
func (n *Network) Kill(id uint64) {
	n.mu.Lock()
	n.dead[id] = true
	n.mu.Unlock()
}

// Revive ends Kill: the node's process is starting again.
func (n *Network) Revive(id uint64) {
	n.mu.Lock()
	delete(n.dead, id)
	n.mu.Unlock()
}

// CutRegion isolates a region from every other region until Heal; traffic inside
// the region still flows.
func (n *Network) CutRegion(region string) {
	n.mu.Lock()
	n.cutRegions[region] = true
	n.mu.Unlock()
}

// SetDropRate drops each message independently with probability p (0 ≤ p ≤ 1).
func (n *Network) SetDropRate(p float64) {
	n.mu.Lock()
	n.dropRate = p
	n.mu.Unlock()
}

// SetDuplicateRate delivers each message a second time with probability p
// (0 ≤ p ≤ 1): a Raft message is queued twice, a request reaches its server
// twice (the client sees the first reply).
func (n *Network) SetDuplicateRate(p float64) {
	n.mu.Lock()
	n.dupRate = p
	n.mu.Unlock()
}

// SetExtraDelay adds d to every message's one-way delay, intra-region included.
func (n *Network) SetExtraDelay(d time.Duration) {
	n.mu.Lock()
	n.extraDelay = d
	n.mu.Unlock()
}

// Heal removes every injected fault: cuts, starved nodes and logs, drops,
// duplicates, extra delay and RTT changes.
func (n *Network) Heal() {
	n.mu.Lock()
	n.cutNodes = map[uint64]bool{}
	n.starved = map[uint64]bool{}
	n.logStarved = map[uint64]bool{}
	n.cutRegions = map[string]bool{}
	n.dropRate = 0
	n.dupRate = 0
	n.extraDelay = 0
	n.rtt = map[[2]string]time.Duration{}
	n.mu.Unlock()
}

// NodeEndpoint returns the endpoint of node id, or a region-less endpoint if the
// topology does not know it.
func (n *Network) NodeEndpoint(id uint64) Endpoint {
	node, _ := n.Node(id)
	return Endpoint{Node: id, Region: node.Region}
}

// Topology returns the topology the network was built from.
func (n *Network) Topology() *topology.Topology { return n.top }
