package coordinator

import (
	"context"
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/placement"
)

// placementRefresh is how old the cached placement rules may grow before a
// write refreshes them (in the background: the write goes on with the
// cached rules).
const placementRefresh = 5 * time.Second

// placementTimeout bounds one refresh of the placement rules.
const placementTimeout = 2 * time.Second

// placementRules caches the operator's placement rules (DESIGN.md §13) for
// the check of by-row keys on writes.
type placementRules struct {
	mu       sync.Mutex
	rules    []*directorypb.PlacementRule
	fetched  time.Time
	fetching bool
}

// checkPlacement refuses a write of key that falls under a by-row rule but
// names no region with data (ErrNoRegionInKey). It reads the cached rules,
// refreshing them in the background once they are older than
// placementRefresh.
func (c *Coordinator) checkPlacement(key []byte) error {
	p := &c.placement
	p.mu.Lock()
	rules := p.rules
	if !p.fetching && time.Since(p.fetched) >= placementRefresh {
		p.fetching = true
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), placementTimeout)
			defer cancel()
			_ = c.RefreshPlacement(ctx)
		}()
	}
	p.mu.Unlock()
	return placement.CheckKey(rules, c.dirs.Regions(), key)
}

// RefreshPlacement reads the placement rules from the nearest directory
// that answers into the cache writes check keys against. Errors: the
// directories'.
func (c *Coordinator) RefreshPlacement(ctx context.Context) error {
	var rules []*directorypb.PlacementRule
	var err error
	for _, region := range c.nearDirectories() {
		if rules, err = c.dirs.Of(region).PlacementRules(ctx); err == nil {
			break
		}
	}
	p := &c.placement
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fetching = false
	if err != nil {
		return err
	}
	p.rules, p.fetched = rules, time.Now()
	return nil
}

// nearDirectories lists the regions with a directory, the client's own
// first.
func (c *Coordinator) nearDirectories() []string {
	out := []string{}
	if c.dirs.Of(c.region) != nil {
		out = append(out, c.region)
	}
	for _, r := range c.dirs.Regions() {
		if r != c.region {
			out = append(out, r)
		}
	}
	return out
}
