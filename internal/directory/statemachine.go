// Package directory is the replicated range directory (DESIGN.md §11): one
// Raft group per region holding the descriptors of the ranges homed there,
// the region's range-ID allocator, and a copy of the cluster-wide placement
// map (which spans are homed in which region). The topology file seeds each
// directory once, when its replica is first created; from then on range
// leaders write every split and merge to it, and reconcile with it
// periodically. Routing resolves a key by the placement map and the home
// region's directory (Resolver).
package directory

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
)

// Errors of the directory's commands and calls.
var (
	// ErrBadDescriptor: a descriptor without a range ID, with an inverted
	// span, or homed in another region than the directory's.
	ErrBadDescriptor = errors.New("directory: malformed descriptor")
	// ErrBadCommand: a log entry or request that does not decode.
	ErrBadCommand = errors.New("directory: malformed command")
	// ErrIDsExhausted: the region's block of range IDs is used up.
	ErrIDsExhausted = errors.New("directory: the region's range IDs are used up")
)

// Keys under the group's state prefix.
const (
	keyDescriptor = 'd' // + range ID (8 bytes, big-endian) → RangeDescriptor
	keyPlacement  = 'p' // + start key → Placement
	keyIDs        = 'n' // → next and last range ID (8 bytes each)
	keySeeded     = 's' // present once the seed is written
)

// Seed is what the topology file gives a directory, once: the ranges the
// region homes, the placement map, and the region's block of range IDs
// [FirstID, LastID], and the registry's first records (the file's nodes of
// the region).
type Seed struct {
	Region          string
	Descriptors     []*pb.RangeDescriptor
	Placements      []*directorypb.Placement
	FirstID, LastID uint64
	Nodes           []*directorypb.NodeRecord
}

// SeedFor returns the seed of region's directory in top: its ranges at the
// bootstrap generation, the placement map of every region's ranges, and the
// region's block of IDs, the (i+1)-th block of topology.MaxGroupID IDs for
// the i-th region of the file.
func SeedFor(top *topology.Topology, region string) Seed {
	s := Seed{Region: region, Nodes: SeedNodes(top, region)}
	for i, r := range top.Regions {
		if r == region {
			s.FirstID = uint64(i+1) * topology.MaxGroupID
			s.LastID = s.FirstID + topology.MaxGroupID - 1
		}
	}
	for _, g := range top.Ranges() { // by start key
		if g.Region == region {
			s.Descriptors = append(s.Descriptors, routing.BootstrapDescriptor(g))
		}
		if n := len(s.Placements); n > 0 && s.Placements[n-1].GetRegion() == g.Region {
			s.Placements[n-1].EndKey = g.End
			continue
		}
		s.Placements = append(s.Placements, &directorypb.Placement{StartKey: g.Start, EndKey: g.End, Region: g.Region})
	}
	return s
}

// StateMachine is one replica's directory state (raftgroup.StateMachine).
// Apply, Restore and the readers may run concurrently.
type StateMachine struct {
	e      *storage.Engine
	prefix []byte
	region string

	mu          sync.RWMutex
	ranges      []*pb.RangeDescriptor // by start key, disjoint
	placements  []*directorypb.Placement
	next, last  uint64                       // the next range ID to hand out, the block's last
	gcTTLms     uint64                       // the gc_ttl set at run time; 0: the topology's
	protections []*directorypb.Protection    // by id
	nodes       []*directorypb.NodeRecord    // the region's registry, by id
	rules       []*directorypb.PlacementRule // placement rules, by prefix; replaced, never modified (rules.go)
	seedNodes   []*directorypb.NodeRecord    // the registry of a store seeded before it had one
}

// NewStateMachine returns the state machine of directory group `group` on
// e, writing seed first if this store never held the group (the topology
// seeds the directory once; a restart reads what the log made of it).
// Errors wrap storage.ErrCorrupt for undecodable stored state.
func NewStateMachine(e *storage.Engine, group uint64, seed Seed) (*StateMachine, error) {
	sm := &StateMachine{e: e, region: seed.Region, seedNodes: seed.Nodes,
		prefix: binary.BigEndian.AppendUint64([]byte{storage.PrefixState}, group)}
	seeded, err := e.Get(sm.key(keySeeded))
	if err != nil {
		return nil, err
	}
	if seeded == nil {
		b := e.NewBatch()
		st := &directorypb.State{Descriptors: seed.Descriptors, Placements: seed.Placements, NextRangeId: seed.FirstID, LastRangeId: seed.LastID, Nodes: seed.Nodes}
		if err := sm.write(b, st); err != nil {
			_ = b.Close()
			return nil, err
		}
		if err := e.Commit(b, true); err != nil {
			return nil, err
		}
	}
	return sm, sm.load()
}

func (sm *StateMachine) key(kind byte, rest ...byte) []byte {
	return append(append(append([]byte{}, sm.prefix...), kind), rest...)
}

func (sm *StateMachine) descriptorKey(id uint64) []byte {
	return sm.key(keyDescriptor, binary.BigEndian.AppendUint64(nil, id)...)
}

func idsValue(next, last uint64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, next), last)
}

// write replaces the group's stored state with st in b.
func (sm *StateMachine) write(b *pebble.Batch, st *directorypb.State) error {
	if err := b.DeleteRange(sm.prefix, storage.PrefixEnd(sm.prefix), nil); err != nil {
		return err
	}
	for _, d := range st.GetDescriptors() {
		v, err := proto.Marshal(d)
		if err != nil {
			return err
		}
		if err := b.Set(sm.descriptorKey(d.GetRangeId()), v, nil); err != nil {
			return err
		}
	}
	for _, p := range st.GetPlacements() {
		v, err := proto.Marshal(p)
		if err != nil {
			return err
		}
		if err := b.Set(sm.key(keyPlacement, p.GetStartKey()...), v, nil); err != nil {
			return err
		}
	}
	if err := b.Set(sm.key(keyIDs), idsValue(st.GetNextRangeId(), st.GetLastRangeId()), nil); err != nil {
		return err
	}
	if err := sm.writeGCTTL(b, st.GetGcTtlMs()); err != nil {
		return err
	}
	for _, p := range st.GetProtections() {
		if err := sm.writeProtection(b, p); err != nil {
			return err
		}
	}
	for _, n := range st.GetNodes() {
		if err := sm.writeNode(b, n); err != nil {
			return err
		}
	}
	if err := sm.writeRules(b, st.GetRules()); err != nil {
		return err
	}
	return b.Set(sm.key(keySeeded), []byte{1}, nil)
}

// load reads the stored state into memory.
func (sm *StateMachine) load() error {
	var ranges []*pb.RangeDescriptor
	var placements []*directorypb.Placement
	var next, last, gcTTLms uint64
	var protections []*directorypb.Protection
	var nodes []*directorypb.NodeRecord
	var rules []*directorypb.PlacementRule
	err := sm.e.Scan(sm.prefix, storage.PrefixEnd(sm.prefix), func(k, v []byte) (bool, error) {
		var err error
		switch k[len(sm.prefix)] {
		case keyDescriptor:
			d := &pb.RangeDescriptor{}
			err = proto.Unmarshal(v, d)
			ranges = append(ranges, d)
		case keyPlacement:
			p := &directorypb.Placement{}
			err = proto.Unmarshal(v, p)
			placements = append(placements, p)
		case keyIDs:
			if len(v) != 16 {
				err = fmt.Errorf("range IDs of %d bytes", len(v))
			} else {
				next, last = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
			}
		case keyGCTTL:
			if len(v) != 8 {
				err = fmt.Errorf("gc_ttl of %d bytes", len(v))
			} else {
				gcTTLms = binary.BigEndian.Uint64(v)
			}
		case keyProtection:
			p := &directorypb.Protection{}
			err = proto.Unmarshal(v, p)
			protections = append(protections, p) // by id: the keys' order
		case keyNode:
			n := &directorypb.NodeRecord{}
			err = proto.Unmarshal(v, n)
			nodes = append(nodes, n) // by id: the keys' order
		case keyRule:
			var r *directorypb.PlacementRule
			if r, err = loadRule(v); err == nil {
				rules = append(rules, r) // by prefix: the keys' order
			}
		}
		if err != nil {
			return false, fmt.Errorf("%w: directory state: %v", storage.ErrCorrupt, err)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	sortByStart(ranges)
	if len(nodes) == 0 {
		// Seeded before the registry existed: the file's nodes, which every
		// replica of the group reads alike.
		nodes = cloneNodes(sm.seedNodes)
		sortNodes(nodes)
	}
	sm.mu.Lock()
	sm.ranges, sm.placements, sm.next, sm.last = ranges, placements, next, last
	sm.gcTTLms, sm.protections, sm.nodes, sm.rules = gcTTLms, protections, nodes, rules
	sm.mu.Unlock()
	return nil
}

func sortByStart(ds []*pb.RangeDescriptor) {
	sort.Slice(ds, func(i, j int) bool { return bytes.Compare(ds[i].GetStartKey(), ds[j].GetStartKey()) < 0 })
}

// checkDescriptor vets a descriptor for this directory.
func (sm *StateMachine) checkDescriptor(d *pb.RangeDescriptor) error {
	switch {
	case d.GetRangeId() == 0:
		return fmt.Errorf("%w: no range ID", ErrBadDescriptor)
	case len(d.GetEndKey()) > 0 && bytes.Compare(d.GetStartKey(), d.GetEndKey()) >= 0:
		return fmt.Errorf("%w: range %d: end %q is not after start %q", ErrBadDescriptor, d.GetRangeId(), d.GetEndKey(), d.GetStartKey())
	case d.GetRegion() != sm.region && !d.GetRehomed():
		return fmt.Errorf("%w: range %d is homed in %q, this directory is %q's", ErrBadDescriptor, d.GetRangeId(), d.GetRegion(), sm.region)
	case d.GetGeneration() == 0:
		return fmt.Errorf("%w: range %d: generation 0", ErrBadDescriptor, d.GetRangeId())
	}
	return nil
}

// Changes reports whether installing d would change the directory: false
// when d is stale (a newer descriptor overlaps it) or already stored as it
// is. A leader's reconciliation proposes only what changes. Errors:
// ErrBadDescriptor.
func (sm *StateMachine) Changes(d *pb.RangeDescriptor) (bool, error) {
	if err := sm.checkDescriptor(d); err != nil {
		return false, err
	}
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	if sm.placedNewer(d) {
		return false, nil
	}
	if d.GetRegion() != sm.region {
		return sm.changesElsewhere(d), nil
	}
	if _, moved := placeSpan(sm.placements, d); moved && d.GetRehomed() {
		return true, nil
	}
	for _, o := range sm.ranges {
		if o.GetRangeId() == d.GetRangeId() && proto.Equal(o, d) {
			return false, nil
		}
	}
	_, _, installed := routing.Install(sm.ranges, d)
	return installed, nil
}

// Apply implements raftgroup.StateMachine. The command is a marshalled
// directorypb.Command; the result is the number of descriptors installed
// (uint32) for an update, the allocated range ID (uint64) for an allocate,
// nil for the registry's commands, or an error (ErrBadCommand,
// ErrBadDescriptor, ErrIDsExhausted, the registry's errors), which changes
// nothing.
func (sm *StateMachine) Apply(b *pebble.Batch, _ uint64, cmd []byte) any {
	c := &directorypb.Command{}
	if err := proto.Unmarshal(cmd, c); err != nil {
		return fmt.Errorf("%w: %v", ErrBadCommand, err)
	}
	switch c := c.GetCmd().(type) {
	case *directorypb.Command_Update:
		return sm.applyUpdate(b, c.Update.GetDescriptors())
	case *directorypb.Command_Allocate:
		return sm.applyAllocate(b)
	case *directorypb.Command_SetGcTtl:
		return sm.applySetGCTTL(b, c.SetGcTtl)
	case *directorypb.Command_Protect:
		return sm.applyProtect(b, c.Protect)
	case *directorypb.Command_Release:
		return sm.applyRelease(b, c.Release)
	case *directorypb.Command_RegisterNode:
		return sm.applyRegister(b, c.RegisterNode)
	case *directorypb.Command_SetNodeState:
		return sm.applySetNodeState(b, c.SetNodeState)
	case *directorypb.Command_SetPlacementRule:
		return sm.applyPlacementRule(b, c.SetPlacementRule)
	}
	return fmt.Errorf("%w: empty command", ErrBadCommand)
}

func (sm *StateMachine) applyUpdate(b *pebble.Batch, descs []*pb.RangeDescriptor) any {
	for _, d := range descs {
		if err := sm.checkDescriptor(d); err != nil {
			return err
		}
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var n uint32
	for _, d := range descs {
		if sm.placedNewer(d) {
			continue // a later rehome moved its span
		}
		if d.GetRehomed() {
			moved, err := sm.applyPlacement(b, d)
			if err != nil {
				return err
			}
			if moved {
				n++
			}
		}
		inst := d
		if d.GetRegion() != sm.region {
			inst = movedAway(d) // rehomed away from this region
		}
		ranges, displaced, installed := routing.Install(sm.ranges, inst)
		if !installed {
			continue
		}
		if inst != d {
			sm.ranges = ranges
			for _, id := range displaced {
				if err := b.Delete(sm.descriptorKey(id), nil); err != nil {
					return err
				}
			}
			if len(displaced) > 0 {
				n++
			}
			continue
		}
		n++
		// One descriptor per range ID, as the store keys them: an older one
		// of d's range that d does not overlap goes too, or a restarted
		// replica (which reads the store) would differ from the others.
		sm.ranges = slices.DeleteFunc(ranges, func(o *pb.RangeDescriptor) bool { return o.GetRangeId() == d.GetRangeId() && o != d })
		for _, id := range displaced {
			if err := b.Delete(sm.descriptorKey(id), nil); err != nil {
				return err
			}
		}
		if d.GetSubsumed() {
			if err := b.Delete(sm.descriptorKey(d.GetRangeId()), nil); err != nil {
				return err
			}
			continue
		}
		v, err := proto.Marshal(d)
		if err != nil {
			return err
		}
		if err := b.Set(sm.descriptorKey(d.GetRangeId()), v, nil); err != nil {
			return err
		}
	}
	return n
}

func (sm *StateMachine) applyAllocate(b *pebble.Batch) any {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.next == 0 || sm.next > sm.last {
		return fmt.Errorf("%w (block ends at %d)", ErrIDsExhausted, sm.last)
	}
	id := sm.next
	if err := b.Set(sm.key(keyIDs), idsValue(id+1, sm.last), nil); err != nil {
		return err
	}
	sm.next++
	return id
}

// Lookup returns the descriptor of the range holding key, then up to
// limit-1 of the ranges after it, in key order (none if no range holds key
// now: a split or merge not written yet).
func (sm *StateMachine) Lookup(key []byte, limit int) []*pb.RangeDescriptor {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	i := sort.Search(len(sm.ranges), func(i int) bool { return bytes.Compare(sm.ranges[i].GetStartKey(), key) > 0 })
	if i == 0 || !routing.Contains(sm.ranges[i-1], key) {
		return nil
	}
	return cloneAll(sm.ranges[i-1 : min(len(sm.ranges), i-1+max(limit, 1))])
}

// List returns every descriptor, by start key.
func (sm *StateMachine) List() []*pb.RangeDescriptor {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return cloneAll(sm.ranges)
}

// Placements returns the placement map, by start key.
func (sm *StateMachine) Placements() []*directorypb.Placement {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	out := make([]*directorypb.Placement, len(sm.placements))
	for i, p := range sm.placements {
		out[i] = proto.CloneOf(p)
	}
	return out
}

func cloneAll(ds []*pb.RangeDescriptor) []*pb.RangeDescriptor {
	out := make([]*pb.RangeDescriptor, len(ds))
	for i, d := range ds {
		out[i] = proto.CloneOf(d)
	}
	return out
}

// Snapshot implements raftgroup.StateMachine: a marshalled directorypb.State.
func (sm *StateMachine) Snapshot() ([]byte, error) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return proto.Marshal(&directorypb.State{Descriptors: sm.ranges, Placements: sm.placements, NextRangeId: sm.next, LastRangeId: sm.last,
		GcTtlMs: sm.gcTTLms, Protections: sm.protections, Nodes: sm.nodes, Rules: sm.rules})
}

// Restore implements raftgroup.StateMachine. Errors wrap storage.ErrCorrupt
// for a snapshot that does not decode.
func (sm *StateMachine) Restore(b *pebble.Batch, data []byte) error {
	st := &directorypb.State{}
	if err := proto.Unmarshal(data, st); err != nil {
		return fmt.Errorf("%w: directory snapshot: %v", storage.ErrCorrupt, err)
	}
	if err := sm.write(b, st); err != nil {
		return err
	}
	ranges := slices.Clone(st.GetDescriptors())
	sortByStart(ranges)
	protections := slices.Clone(st.GetProtections())
	slices.SortFunc(protections, func(a, b *directorypb.Protection) int { return strings.Compare(a.GetId(), b.GetId()) })
	nodes := slices.Clone(st.GetNodes())
	if len(nodes) == 0 { // from a leader whose store predates the registry
		nodes = cloneNodes(sm.seedNodes)
	}
	sortNodes(nodes)
	sm.mu.Lock()
	sm.ranges, sm.placements, sm.next, sm.last = ranges, st.GetPlacements(), st.GetNextRangeId(), st.GetLastRangeId()
	rules := slices.Clone(st.GetRules())
	slices.SortFunc(rules, func(a, b *directorypb.PlacementRule) int { return bytes.Compare(a.GetPrefix(), b.GetPrefix()) })
	sm.gcTTLms, sm.protections, sm.nodes, sm.rules = st.GetGcTtlMs(), protections, nodes, rules
	sm.mu.Unlock()
	return nil
}
