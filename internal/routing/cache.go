// Package routing finds the range that holds a key and the node that leads
// it (DESIGN.md §11): a cache of range descriptors, refreshed by the typed
// mismatch replies of ranges and by a Resolver on a miss, and the leader
// hints ranges return. It is the one routing client of the coordinator (and,
// as they come, of nodes and admin commands).
package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// Resolver returns authoritative descriptors: at least the one whose span
// holds key. The replicated directory implements it (directory.Resolver),
// with NodesResolver as its fallback.
type Resolver interface {
	Resolve(ctx context.Context, key []byte) ([]*pb.RangeDescriptor, error)
}

// ErrNoRange: the resolver knows no range holding the key.
var ErrNoRange = errors.New("routing: no range holds the key")

// Cache holds range descriptors, sorted by start key and disjoint, and the
// node believed to lead each range. It is safe for concurrent use.
type Cache struct {
	resolver  Resolver
	resolving sync.Mutex // one resolution at a time: a split makes every client miss at once

	mu      sync.RWMutex
	ranges  []*pb.RangeDescriptor // by start key; spans never overlap
	leaders map[uint64]uint64     // range ID → node believed to lead it
}

// NewCache returns a cache filled with seed (as by Update) that resolves
// misses through r.
func NewCache(r Resolver, seed ...*pb.RangeDescriptor) *Cache {
	c := &Cache{resolver: r, leaders: map[uint64]uint64{}}
	c.Update(seed...)
	return c
}

// Contains reports whether key lies in d's span.
func Contains(d *pb.RangeDescriptor, key []byte) bool {
	return bytes.Compare(d.GetStartKey(), key) <= 0 && (len(d.GetEndKey()) == 0 || bytes.Compare(key, d.GetEndKey()) < 0)
}

// overlaps reports whether d's span and [lo, hi) share a key (a nil hi is
// unbounded).
func overlaps(d *pb.RangeDescriptor, lo, hi []byte) bool {
	return (hi == nil || bytes.Compare(d.GetStartKey(), hi) < 0) && (len(d.GetEndKey()) == 0 || bytes.Compare(lo, d.GetEndKey()) < 0)
}

// Update installs descriptors learned from a mismatch reply or a resolver,
// each as Install says; a displaced range's leader hint goes with it.
func (c *Cache) Update(descs ...*pb.RangeDescriptor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range descs {
		var displaced []uint64
		c.ranges, displaced, _ = Install(c.ranges, d)
		for _, id := range displaced {
			delete(c.leaders, id)
		}
	}
}

// Install applies the descriptor rule of DESIGN.md §11 to ranges (sorted by
// start key, disjoint) and returns the result, the IDs of the ranges d
// displaced, and whether d was installed (false: it is stale). d replaces every descriptor whose span it overlaps, unless one
// of those has a higher generation (d is then stale and nothing changes):
// generations rise with every split and merge, and a merge takes a
// generation above both halves', so the newer of two overlapping descriptors
// has the higher one. A subsumed d (a range merged into its left neighbour)
// drops the older ones it overlaps and is not kept: its span is the merged
// range's. ranges is not modified; the result shares its descriptors. The
// routing cache and the replicated directory both keep descriptors by it.
func Install(ranges []*pb.RangeDescriptor, d *pb.RangeDescriptor) (_ []*pb.RangeDescriptor, displaced []uint64, installed bool) {
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
	}
	kept := make([]*pb.RangeDescriptor, 0, len(ranges)+1)
	for _, o := range ranges {
		if !overlaps(o, d.GetStartKey(), end) {
			kept = append(kept, o)
			continue
		}
		if o.GetGeneration() > d.GetGeneration() {
			return ranges, nil, false
		}
		if o.GetRangeId() != d.GetRangeId() || d.GetSubsumed() {
			displaced = append(displaced, o.GetRangeId())
		}
	}
	if !d.GetSubsumed() {
		kept = append(kept, d)
	}
	sort.Slice(kept, func(i, j int) bool { return bytes.Compare(kept[i].GetStartKey(), kept[j].GetStartKey()) < 0 })
	return kept, displaced, true
}

// Reset drops every cached descriptor and leader hint, then installs descs
// as Update does: a full refresh (a test makes the cache stale this way).
func (c *Cache) Reset(descs ...*pb.RangeDescriptor) {
	c.mu.Lock()
	c.ranges, c.leaders = nil, map[uint64]uint64{}
	c.mu.Unlock()
	c.Update(descs...)
}

// cached returns the cached descriptor holding key, or nil.
func (c *Cache) cached(key []byte) *pb.RangeDescriptor {
	c.mu.RLock()
	defer c.mu.RUnlock()
	i := sort.Search(len(c.ranges), func(i int) bool { return bytes.Compare(c.ranges[i].GetStartKey(), key) > 0 })
	if i > 0 && Contains(c.ranges[i-1], key) {
		return c.ranges[i-1]
	}
	return nil
}

// Lookup returns the descriptor of the range holding key, from the cache or,
// on a miss, from the resolver (caching what it returns). Errors: ErrNoRange,
// or the resolver's.
func (c *Cache) Lookup(ctx context.Context, key []byte) (*pb.RangeDescriptor, error) {
	if d := c.cached(key); d != nil {
		return d, nil
	}
	c.resolving.Lock()
	defer c.resolving.Unlock()
	if d := c.cached(key); d != nil {
		return d, nil // resolved meanwhile
	}
	descs, err := c.resolver.Resolve(ctx, key)
	if err != nil {
		return nil, err
	}
	c.Update(descs...)
	if d := c.cached(key); d != nil {
		return d, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrNoRange, key)
}

// Part is the part [Start, End) of a span that falls in range Desc (a nil
// End: to the end of the key space).
type Part struct {
	Desc       *pb.RangeDescriptor
	Start, End []byte
}

// Overlapping splits [lo, hi) (a nil hi: to the end of the key space) by
// range, in key order, looking up each range in turn. Errors as Lookup's.
func (c *Cache) Overlapping(ctx context.Context, lo, hi []byte) ([]Part, error) {
	var out []Part
	for start := lo; ; {
		d, err := c.Lookup(ctx, start)
		if err != nil {
			return nil, err
		}
		end := hi
		if len(d.GetEndKey()) > 0 && (end == nil || bytes.Compare(d.GetEndKey(), end) < 0) {
			end = d.GetEndKey()
		}
		if end == nil || bytes.Compare(start, end) < 0 {
			out = append(out, Part{Desc: d, Start: start, End: end})
		}
		if end == nil || (hi != nil && bytes.Compare(end, hi) >= 0) {
			return out, nil
		}
		start = end
	}
}

// Forget drops range id's descriptor and leader hint: no node hosts the
// range any more (it was merged away), and the next lookup of its span
// resolves again.
func (c *Cache) Forget(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ranges = slices.DeleteFunc(c.ranges, func(d *pb.RangeDescriptor) bool { return d.GetRangeId() == id })
	delete(c.leaders, id)
}

// Leader returns the node believed to lead range id.
func (c *Cache) Leader(id uint64) (uint64, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n, ok := c.leaders[id]
	return n, ok
}

// SetLeader records node as range id's leader (a hint: a reply from it, or
// a NotLeader hint from another replica).
func (c *Cache) SetLeader(id, node uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaders[id] = node
}

// ForgetLeader drops range id's leader hint.
func (c *Cache) ForgetLeader(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.leaders, id)
}

// RegionUnreachableError is a lookup that failed because the directory of
// Region did not answer: the error names the region so a caller can say
// which one is cut off, down or excluded.
type RegionUnreachableError struct {
	Region string
	Err    error
}

func (e *RegionUnreachableError) Error() string {
	return fmt.Sprintf("the %s directory did not answer: %v", e.Region, e.Err)
}

func (e *RegionUnreachableError) Unwrap() error { return e.Err }

// SameNodes reports whether a and b name the same nodes, in any order (two
// descriptors' replicas, or their non-voters).
func SameNodes(a, b []uint64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
