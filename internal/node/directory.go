package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// Timing of the node's writes to the range directories (DESIGN.md §11).
const (
	// publishTimeout bounds writing one split's or merge's descriptors.
	publishTimeout = 5 * time.Second
	// reconcileInterval is how often the node writes the descriptors of the
	// ranges it leads to their directories, so a change whose write was lost
	// (the directory without quorum, the leader crashing after the apply)
	// reaches the directory anyway. An up-to-date directory costs a read.
	reconcileInterval = 5 * time.Second
	// allocateTimeout bounds allocating a split's range ID.
	allocateTimeout = 5 * time.Second
)

// publish writes descriptors a split or merge just applied here to the
// directory of their region, in the background; the reconciliation loop
// covers a write that fails.
func (n *Node) publish(descs ...*pb.RangeDescriptor) {
	if len(descs) == 0 {
		return
	}
	n.background(func() {
		ctx, cancel := context.WithTimeout(n.stopped, publishTimeout)
		defer cancel()
		if err := n.writeDescriptors(ctx, descs); err != nil && n.stopped.Err() == nil {
			slog.Warn("node: writing descriptors to the directory (the reconciliation retries)", "node", n.cfg.NodeID, "range", descs[0].GetRangeId(), "err", err)
		}
	})
}

// background runs fn in a goroutine that Close waits for, unless Close
// began; it reports whether fn runs.
func (n *Node) background(fn func()) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closing {
		return false
	}
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		fn()
	}()
	return true
}

// writeDescriptors writes descs, grouped by home region, to the regions'
// directories, each region's own first. A rehomed range's descriptor also
// goes to every other region's directory: it removes the range's entry
// from the directory of a home it left, and homes its span in every copy
// of the placement map (DESIGN.md §13). A region that fails does not stop
// the others; the errors are joined.
func (n *Node) writeDescriptors(ctx context.Context, descs []*pb.RangeDescriptor) error {
	byRegion := map[string][]*pb.RangeDescriptor{}
	var rehomed []*pb.RangeDescriptor
	for _, d := range descs {
		byRegion[d.GetRegion()] = append(byRegion[d.GetRegion()], d)
		if d.GetRehomed() {
			rehomed = append(rehomed, d)
		}
	}
	var errs []error
	write := func(region string, ds []*pb.RangeDescriptor) {
		c := n.dirs.Of(region)
		if c == nil {
			errs = append(errs, fmt.Errorf("region %q has no directory group", region))
			return
		}
		if _, err := c.Update(ctx, ds...); err != nil {
			errs = append(errs, fmt.Errorf("%s directory: %w", region, err))
		}
	}
	for region, ds := range byRegion {
		write(region, ds)
	}
	for _, region := range n.dirs.Regions() {
		var ds []*pb.RangeDescriptor
		for _, d := range rehomed {
			if d.GetRegion() != region {
				ds = append(ds, d)
			}
		}
		if len(ds) > 0 {
			write(region, ds)
		}
	}
	return errors.Join(errs...)
}

// reconcile writes, every reconcileInterval until Close, the descriptors
// of the ranges this node leads to their directories.
func (n *Node) reconcile() {
	defer n.bg.Done()
	t := time.NewTicker(reconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-n.stopped.Done():
			return
		case <-t.C:
		}
		var led []*pb.RangeDescriptor
		for _, r := range n.rangeReplicas() {
			if d := r.Desc(); r.LeaderHint() == n.cfg.NodeID && !d.GetSubsumed() {
				led = append(led, d)
			}
		}
		ctx, cancel := context.WithTimeout(n.stopped, reconcileInterval)
		if err := n.writeDescriptors(ctx, led); err != nil && n.stopped.Err() == nil {
			slog.Warn("node: reconciling the directory", "node", n.cfg.NodeID, "err", err)
		}
		cancel()
	}
}

// rangeIDAllocator returns the allocator of range IDs for splits of ranges
// homed in region (rangeserver.Config.NewRangeID): its directory's.
func (n *Node) rangeIDAllocator(region string) func(context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		c := n.dirs.Of(region)
		if c == nil {
			return 0, fmt.Errorf("region %q has no directory group", region)
		}
		ctx, cancel := context.WithTimeout(ctx, allocateTimeout)
		defer cancel()
		return c.Allocate(ctx)
	}
}
