package rangeserver

import (
	"context"
	"log/slog"
)

// Home is what a replica reads from its range's home region: the epochs
// its leases and versions are in, the region's GC policy, and the region's
// allocator of range IDs. A rehome (DESIGN.md §13) moves the range to
// another region's, which Config.HomeOf supplies.
type Home struct {
	// Region names the home region.
	Region string
	// Epochs are the home region's epoch sources, and Near this node's
	// region's publisher when it is not the home.
	Epochs
	// GCPolicy is the home region's GC policy (nil: Config.GCTTL).
	GCPolicy GCPolicySource
	// NewRangeID allocates the ID of a range a split creates, from the
	// home region's directory (nil: splits are refused).
	NewRangeID func(ctx context.Context) (uint64, error)
}

// closing is the epoch source the range's global versions carry: the
// publisher, or in a regional-only deployment the local epoch.
func (e Epochs) closing() EpochSource {
	if e.Publisher == nil {
		return e.Local
	}
	return e.Publisher
}

// src returns the epoch sources of the range's home as this replica last
// followed it.
func (r *Replica) src() Epochs { return r.home.Load().Epochs }

// followHome switches the replica to its range's home region once a rehome
// moved it (the tick calls it): the epochs, GC policy and ID allocator of
// the new home. Local epochs of two regions are not comparable, so the
// replica forgets the newest local epoch it read and its GC samples. A
// home it cannot resolve (Config.HomeOf failing) keeps the old sources and
// is tried again on the next tick; the replica takes no lease meanwhile.
// It reports whether the replica follows the descriptor's home.
func (r *Replica) followHome() bool {
	region := r.sm.Descriptor().GetRegion()
	cur := r.home.Load()
	if cur.Region == region {
		return true
	}
	if r.cfg.HomeOf == nil {
		return false
	}
	h, err := r.cfg.HomeOf(region)
	if err != nil {
		slog.Warn("range rehomed to a region this node cannot reach", "range", r.id, "region", region, "err", err)
		return false
	}
	h.Region = region
	r.home.Store(&h)
	r.lastEpoch.Store(0)
	r.epochRead = epochReading{} // another region's epochs
	r.gcq.samples = nil
	slog.Info("range replica follows its new home", "range", r.id, "region", region)
	return true
}
