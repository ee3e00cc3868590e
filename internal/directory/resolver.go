package directory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/routing"
	"github.com/terroir-db/terroir/internal/topology"
)

// resolveTimeout bounds asking the directories before the fallback is asked.
const resolveTimeout = 2 * time.Second

// Resolver resolves a routing miss (routing.Resolver) through the
// directories: the placement map names the key's home region, and that
// region's directory returns the descriptor of the range holding the key
// and of the ranges after it. The placement map is fetched once, from the
// nearest directory that answers, and again after a lookup finds no range.
// When no directory answers in time, the fallback resolver is asked (the
// nodes themselves), so routing survives a directory without quorum.
type Resolver struct {
	dirs     *Directories
	near     []string         // regions with a directory, nearest first
	fallback routing.Resolver // nil: none

	mu         sync.Mutex
	placements []*directorypb.Placement // nil until fetched
}

// NewResolver returns a resolver for a caller in region of top, asking
// fallback when no directory answers.
func NewResolver(top *topology.Topology, region string, dirs *Directories, fallback routing.Resolver) *Resolver {
	near := slices.Clone(dirs.regions)
	sort.SliceStable(near, func(i, j int) bool { return top.RTT(region, near[i]) < top.RTT(region, near[j]) })
	return &Resolver{dirs: dirs, near: near, fallback: fallback}
}

// Resolve implements routing.Resolver. Errors: routing.ErrNoRange when the
// key's directory holds no range for it now (a reshaping being written) or
// neither the directories nor the fallback answered.
func (r *Resolver) Resolve(ctx context.Context, key []byte) ([]*pb.RangeDescriptor, error) {
	dctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	descs, err := r.lookup(dctx, key)
	cancel()
	if err == nil || errors.Is(err, routing.ErrNoRange) || ctx.Err() != nil {
		return descs, err
	}
	if r.fallback != nil {
		if descs, ferr := r.fallback.Resolve(ctx, key); ferr == nil {
			return descs, nil
		}
	}
	return nil, fmt.Errorf("%w: %q: no directory answered: %w", routing.ErrNoRange, key, err)
}

// lookup asks key's home directory.
func (r *Resolver) lookup(ctx context.Context, key []byte) ([]*pb.RangeDescriptor, error) {
	region, err := r.home(ctx, key)
	if err != nil {
		return nil, err
	}
	c := r.dirs.Of(region)
	if c == nil {
		return nil, fmt.Errorf("directory: the placement map homes %q in %s, which has no directory group", key, region)
	}
	descs, err := c.Lookup(ctx, key, lookupLimit)
	if err != nil {
		return nil, &routing.RegionUnreachableError{Region: region, Err: err}
	}
	if len(descs) == 0 || !routing.Contains(descs[0], key) {
		r.mu.Lock()
		r.placements = nil // it may have moved (rehoming): read the map again
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %q (the %s directory has none now)", routing.ErrNoRange, key, region)
	}
	return descs, nil
}

// home returns key's home region by the placement map.
func (r *Resolver) home(ctx context.Context, key []byte) (string, error) {
	r.mu.Lock()
	pl := r.placements
	r.mu.Unlock()
	if pl == nil {
		var err error
		if pl, err = r.fetchPlacements(ctx); err != nil {
			return "", err
		}
		r.mu.Lock()
		r.placements = pl
		r.mu.Unlock()
	}
	if p := HomeOf(pl, key); p != nil {
		return p.GetRegion(), nil
	}
	return "", fmt.Errorf("directory: the placement map homes %q nowhere", key)
}

// fetchPlacements reads the placement map from the nearest directory that
// answers.
func (r *Resolver) fetchPlacements(ctx context.Context) ([]*directorypb.Placement, error) {
	err := errors.New("directory: the topology has no directory group")
	for _, region := range r.near {
		var pl []*directorypb.Placement
		rctx, cancel := context.WithTimeout(ctx, resolveTimeout/4) // then the next nearest
		pl, err = r.dirs.Of(region).Placements(rctx)
		cancel()
		if err == nil {
			return pl, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// HomeOf returns the placement holding key in pl (sorted by start key), or
// nil.
func HomeOf(pl []*directorypb.Placement, key []byte) *directorypb.Placement {
	i := sort.Search(len(pl), func(i int) bool { return bytes.Compare(pl[i].GetStartKey(), key) > 0 })
	if i == 0 {
		return nil
	}
	if p := pl[i-1]; len(p.GetEndKey()) == 0 || bytes.Compare(key, p.GetEndKey()) < 0 {
		return p
	}
	return nil
}
