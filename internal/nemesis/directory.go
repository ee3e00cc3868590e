package nemesis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/terroir-db/terroir/internal/directory"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// directoryBound is how long after a reshaping fault heals the directories
// may disagree with the ranges: a new directory leader, then at most one
// reconciliation round (5 s) and its write.
const directoryBound = 20 * time.Second

// checkDirectories waits up to directoryBound for every region's directory
// to list exactly the ranges their leaders serve (ID, span and generation),
// and returns the last difference if they never agree.
func (cp *campaign) checkDirectories(ctx context.Context) error {
	deadline := time.Now().Add(directoryBound)
	dirs := directory.NewDirectories(cp.cfg.Topology, cp.c.Dialer(cp.regions[0]))
	for {
		diff, err := cp.directoryDiff(ctx, dirs)
		if err == nil && diff == "" {
			return nil
		}
		if ctx.Err() != nil {
			return nil // the campaign is ending
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("a directory did not answer within %v: %v", directoryBound, err)
			}
			return fmt.Errorf("the directories disagree with the ranges %v after healing: %s", directoryBound, diff)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// directoryDiff compares each region's directory with the descriptors of
// the ranges homed there, as their leaders hold them now; "" if they agree.
func (cp *campaign) directoryDiff(ctx context.Context, dirs *directory.Directories) (string, error) {
	led := map[string][]string{}
	for _, id := range cp.c.NodeIDs() {
		n := cp.c.Node(id)
		if n == nil {
			continue
		}
		for _, rid := range n.RangeIDs() {
			if r := n.Range(rid); r != nil && r.LeaderHint() == id {
				if d := r.Desc(); !d.GetSubsumed() {
					led[d.GetRegion()] = append(led[d.GetRegion()], render(d))
				}
			}
		}
	}
	var diffs []string
	for _, region := range cp.regions {
		dir := dirs.Of(region)
		if dir == nil {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ds, err := dir.List(lctx)
		cancel()
		if err != nil {
			return "", fmt.Errorf("%s: %w", region, err)
		}
		var listed []string
		for _, d := range ds {
			listed = append(listed, render(d))
		}
		want := led[region]
		slices.Sort(listed)
		slices.Sort(want)
		if !slices.Equal(listed, want) {
			diffs = append(diffs, fmt.Sprintf("%s directory lists %v, leaders hold %v", region, listed, want))
		}
	}
	return strings.Join(diffs, "; "), nil
}

// render names a descriptor by ID, span and generation.
func render(d *pb.RangeDescriptor) string {
	return fmt.Sprintf("%d[%q,%q)@%d", d.GetRangeId(), d.GetStartKey(), d.GetEndKey(), d.GetGeneration())
}
