package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/rangeserver"
)

// gcPolicyRefresh is how old a region's cached GC policy may grow before a
// leader's tick refreshes it in the background.
const gcPolicyRefresh = 5 * time.Second

// gcPolicy is a region's GC policy as this node's range leaders apply it
// (rangeserver.GCPolicySource): read from the region's directory, its
// gc_ttl falling back to the topology file's (DESIGN.md §14).
type gcPolicy struct {
	n      *Node
	region string
	def    time.Duration // the topology file's gc_ttl

	cached     atomic.Pointer[rangeserver.GCPolicy]
	readAt     atomic.Int64 // unix ns of the last read's start
	refreshing atomic.Bool
}

// gcPolicyOf returns region's policy source, creating it once.
func (n *Node) gcPolicyOf(region string) *gcPolicy {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.gcPolicies[region]
	if !ok {
		p = &gcPolicy{n: n, region: region, def: n.cfg.Topology.GCTTL}
		n.gcPolicies[region] = p
	}
	return p
}

// Cached implements rangeserver.GCPolicySource; a stale value starts a
// refresh in the background.
func (p *gcPolicy) Cached() (rangeserver.GCPolicy, bool) {
	if time.Since(time.Unix(0, p.readAt.Load())) > gcPolicyRefresh && p.refreshing.CompareAndSwap(false, true) {
		if !p.n.background(func() {
			defer p.refreshing.Store(false)
			ctx, cancel := context.WithTimeout(p.n.stopped, gcPolicyRefresh)
			defer cancel()
			_, _ = p.Fetch(ctx)
		}) {
			p.refreshing.Store(false)
		}
	}
	c := p.cached.Load()
	if c == nil {
		return rangeserver.GCPolicy{}, false
	}
	return *c, true
}

// Fetch implements rangeserver.GCPolicySource: a linearizable read of the
// region's directory. The horizon's protection is the least epoch of the
// protections the serving replica does not find expired.
func (p *gcPolicy) Fetch(ctx context.Context) (rangeserver.GCPolicy, error) {
	c := p.n.dirs.Of(p.region)
	if c == nil {
		return rangeserver.GCPolicy{}, fmt.Errorf("region %q has no directory group", p.region)
	}
	began := time.Now()
	resp, err := c.GCPolicy(ctx)
	if err != nil {
		return rangeserver.GCPolicy{}, err
	}
	pol := policyOf(resp, p.def)
	p.cached.Store(&pol)
	p.readAt.Store(began.UnixNano())
	return pol, nil
}

// policyOf turns a directory's answer into the policy a leader applies.
func policyOf(resp *directorypb.GCPolicyResponse, def time.Duration) rangeserver.GCPolicy {
	pol := rangeserver.GCPolicy{TTL: def}
	if ms := resp.GetGcTtlMs(); ms > 0 {
		pol.TTL = time.Duration(ms) * time.Millisecond
	}
	for _, s := range resp.GetProtections() {
		if s.GetExpired() {
			continue
		}
		if e := s.GetProtection().GetEpoch(); !pol.Protects || e < pol.Protected {
			pol.Protected, pol.Protects = e, true
		}
	}
	return pol
}
