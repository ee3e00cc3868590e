package admin

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// NodeStatusTimeout bounds one node's answer to Status: a node that does
// not answer within it is reported down.
const NodeStatusTimeout = time.Second

// ClusterStatus is the cluster as its nodes report it, for `terroir status`
// (its --json is this, encoded) and the web console.
type ClusterStatus struct {
	// At is when the report was gathered.
	At time.Time `json:"at"`
	// Nodes: every node of the topology, up or not.
	Nodes []NodeInfo `json:"nodes"`
	// Regions: each region's local epoch, publisher and exclusion.
	Regions []RegionInfo `json:"regions"`
	// GlobalEpoch is the global epoch service's epoch (0: none, or no
	// replica answered).
	GlobalEpoch uint64 `json:"global_epoch,omitempty"`
	// Groups: every Raft group with a replica that answered, by ID.
	Groups []GroupInfo `json:"groups"`
	// Ranges: every range a node reported, by start key.
	Ranges []RangeInfo `json:"ranges"`
}

// NodeInfo is one node: up when it answered Status within
// NodeStatusTimeout.
type NodeInfo struct {
	ID       uint64 `json:"id"`
	Region   string `json:"region"`
	Addr     string `json:"addr"`
	Up       bool   `json:"up"`
	Version  string `json:"version,omitempty"`
	HTTPAddr string `json:"http_addr,omitempty"`
	// StartedAt is when the node process started (zero when down).
	StartedAt time.Time `json:"started_at,omitzero"`
	// Error says why a down node did not answer.
	Error string `json:"error,omitempty"`
}

// RegionInfo is one region's epochs.
type RegionInfo struct {
	Name string `json:"name"`
	// LocalEpoch: the highest its local epoch group's replicas report.
	LocalEpoch uint64 `json:"local_epoch,omitempty"`
	// PublisherEpoch: its publisher's copy of the global epoch (0: none).
	PublisherEpoch uint64 `json:"publisher_epoch,omitempty"`
	// PublisherAgeMS: ms since the publisher's leader last applied a new
	// global epoch — its freshness (0: unknown).
	PublisherAgeMS uint64 `json:"publisher_age_ms,omitempty"`
	// Excluded from the global epoch service since the global epoch Since.
	Excluded      bool   `json:"excluded,omitempty"`
	ExcludedSince uint64 `json:"excluded_since,omitempty"`
}

// GroupInfo is one Raft group as its leader (else any replica) reports it.
type GroupInfo struct {
	ID      uint64 `json:"id"`
	Kind    string `json:"kind"`
	Region  string `json:"region"`
	Leader  uint64 `json:"leader"`
	Term    uint64 `json:"term"`
	Applied uint64 `json:"applied"`
	Epoch   uint64 `json:"epoch,omitempty"`
	// Replicas: with a leader that answered, each replica's lag behind the
	// leader's commit index, in log entries.
	Replicas []ReplicaLag `json:"replicas,omitempty"`
}

// ReplicaLag is how far one replica's log trails its leader's commit index.
type ReplicaLag struct {
	Node  uint64 `json:"node"`
	Match uint64 `json:"match"`
	Lag   uint64 `json:"lag"`
}

// RangeInfo is one range as its leaseholder (else any replica) reports it.
type RangeInfo struct {
	ID     uint64 `json:"id"`
	Start  string `json:"start"`
	End    string `json:"end"`
	Region string `json:"region"`
	// Leader is the node serving the range under its lease (0: none answered as leader).
	Leader      uint64 `json:"leader"`
	LeaseHolder uint64 `json:"lease_holder"`
	LeaseStart  uint64 `json:"lease_start"`
	LeaseEnd    uint64 `json:"lease_end"`
	// EpochsLeft is the lease's end minus the region's local epoch (nil:
	// unknown); below 0 the lease has lapsed.
	EpochsLeft  *int64  `json:"epochs_left"`
	ClosedEpoch uint64  `json:"closed_epoch"`
	SizeBytes   uint64  `json:"size_bytes"`
	QPS         float64 `json:"qps"`
	Locks       uint32  `json:"locks"`
}

// Status asks every node of top for its status at once (each bounded by
// NodeStatusTimeout, the whole by ctx) and assembles the cluster's. It
// fails only when ctx ends first; nodes that do not answer are down.
func Status(ctx context.Context, d *transport.Dialer, top *topology.Topology) (*ClusterStatus, error) {
	reports := make([]*nodepb.StatusResponse, len(top.Nodes))
	errs := make([]error, len(top.Nodes))
	var wg sync.WaitGroup
	for i, n := range top.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := d.Conn(n.ID)
			if err == nil {
				nctx, cancel := context.WithTimeout(ctx, NodeStatusTimeout)
				reports[i], err = nodepb.NewNodeClient(conn).Status(nctx, &nodepb.StatusRequest{})
				cancel()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := &ClusterStatus{At: time.Now()}
	groups := map[uint64]*nodepb.GroupStatus{}
	kinds := map[uint64]bool{} // groups reported by their leader
	ranges := map[uint64]*RangeInfo{}
	locals := map[string]uint64{}
	for i, n := range top.Nodes {
		ni := NodeInfo{ID: n.ID, Region: n.Region, Addr: n.Addr}
		r := reports[i]
		if r == nil {
			ni.Error = Describe(errs[i])
			st.Nodes = append(st.Nodes, ni)
			continue
		}
		ni.Up, ni.Version, ni.HTTPAddr, ni.StartedAt = true, r.GetVersion(), r.GetHttpAddr(), time.UnixMilli(r.GetStartedUnixMs())
		st.Nodes = append(st.Nodes, ni)
		for _, g := range r.GetGroups() {
			leads := g.GetLeader() == n.ID
			if _, seen := groups[g.GetGroupId()]; !seen || (leads && !kinds[g.GetGroupId()]) {
				groups[g.GetGroupId()], kinds[g.GetGroupId()] = g, leads
			}
			if g.GetKind() == string(topology.KindLocalEpoch) {
				locals[g.GetRegion()] = max(locals[g.GetRegion()], g.GetEpoch())
			}
		}
		for _, rs := range r.GetRanges() {
			desc := rs.GetRangeDescriptor()
			cur, seen := ranges[desc.GetRangeId()]
			if seen && (cur.Leader != 0 || !rs.GetLeader()) {
				continue
			}
			ri := &RangeInfo{ID: desc.GetRangeId(), Start: string(desc.GetStartKey()), End: string(desc.GetEndKey()), Region: desc.GetRegion(),
				LeaseHolder: rs.GetLease().GetHolder(), LeaseStart: rs.GetLease().GetStart(), LeaseEnd: rs.GetLease().GetEnd(),
				ClosedEpoch: rs.GetClosedEpoch(), SizeBytes: rs.GetSizeBytes(), QPS: rs.GetQps(), Locks: rs.GetLocks()}
			if rs.GetLeader() {
				ri.Leader = n.ID
			}
			ranges[desc.GetRangeId()] = ri
		}
	}
	for _, g := range groups {
		gi := GroupInfo{ID: g.GetGroupId(), Kind: g.GetKind(), Region: g.GetRegion(), Leader: g.GetLeader(), Term: g.GetTerm(),
			Applied: g.GetApplied(), Epoch: g.GetEpoch()}
		for _, p := range g.GetProgress() {
			gi.Replicas = append(gi.Replicas, ReplicaLag{Node: p.GetNode(), Match: p.GetMatch(), Lag: g.GetCommit() - min(p.GetMatch(), g.GetCommit())})
		}
		slices.SortFunc(gi.Replicas, func(a, b ReplicaLag) int { return cmp.Compare(a.Node, b.Node) })
		st.Groups = append(st.Groups, gi)
	}
	slices.SortFunc(st.Groups, func(a, b GroupInfo) int { return cmp.Compare(a.ID, b.ID) })
	for _, ri := range ranges {
		if l, ok := locals[ri.Region]; ok && ri.LeaseHolder != 0 {
			left := int64(ri.LeaseEnd) - int64(l)
			ri.EpochsLeft = &left
		}
		st.Ranges = append(st.Ranges, *ri)
	}
	slices.SortFunc(st.Ranges, func(a, b RangeInfo) int { return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.ID, b.ID)) })
	for _, region := range top.Regions {
		ri := RegionInfo{Name: region, LocalEpoch: locals[region]}
		for _, g := range groups {
			if g.GetKind() == string(topology.KindPublisher) && g.GetRegion() == region {
				ri.PublisherEpoch, ri.PublisherAgeMS = g.GetEpoch(), g.GetEpochAgeMs()
			}
			if g.GetKind() == string(topology.KindGlobalEpoch) {
				st.GlobalEpoch = max(st.GlobalEpoch, g.GetEpoch())
			}
		}
		st.Regions = append(st.Regions, ri)
	}
	if len(top.GroupsOfKind(topology.KindGlobalEpoch, "")) > 0 {
		mctx, cancel := context.WithTimeout(ctx, NodeStatusTimeout)
		regions, _, err := Regions(mctx, d, top)
		cancel()
		if err == nil {
			for _, r := range regions {
				for i := range st.Regions {
					if st.Regions[i].Name == r.Region {
						st.Regions[i].Excluded, st.Regions[i].ExcludedSince = r.Excluded, r.Since
					}
				}
			}
		}
	}
	return st, nil
}
