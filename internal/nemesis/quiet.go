package nemesis

import (
	"context"
	"time"

	"github.com/terroir-db/terroir/internal/epoch"
)

// quietIdleWithin bounds how long a quiet spell (faultQuietKill) waits for
// the epochs to fall to their idle pace: a read keeps the full pace for
// epoch.PaceHold, and operations under way when the spell began (a lock
// wait, a retry) may end seconds later.
const quietIdleWithin = epoch.PaceHold + 6*time.Second

// hush begins a quiet spell: the workloads' clients hold their next
// operation until end is called (the changefeed keeps streaming: it reads
// no epoch), and the epoch monitor reads in the background, so every epoch
// falls to its idle pace (epoch.Pace). end is idempotent.
func (cp *campaign) hush() (end func()) {
	ch := make(chan struct{})
	cp.mu.Lock()
	cp.hushed = ch
	cp.mu.Unlock()
	return func() {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		if cp.hushed == ch {
			close(ch)
			cp.hushed = nil
		}
	}
}

// quiet reports whether a quiet spell is under way.
func (cp *campaign) quiet() bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.hushed != nil
}

// waitLoud returns once no quiet spell is under way; false if ctx ended
// first.
func (cp *campaign) waitLoud(ctx context.Context) bool {
	cp.mu.Lock()
	ch := cp.hushed
	cp.mu.Unlock()
	if ch == nil {
		return ctx.Err() == nil
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// idleEpochs waits, in a quiet spell, until every data region's local
// epoch advances at its idle pace — at most a quarter of the full pace's
// advances over 500 ms, read in the background — and reports whether that
// happened within quietIdleWithin.
func (cp *campaign) idleEpochs(ctx context.Context) bool {
	deadline := time.Now().Add(quietIdleWithin)
	if !sleep(ctx, epoch.PaceHold) {
		return false
	}
	var readers []*epoch.Reader
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	for _, region := range cp.regions {
		r, err := cp.c.EpochReader(region)
		if err != nil {
			return false
		}
		readers = append(readers, r)
	}
	const window = 500 * time.Millisecond
	full := uint64(window / cp.cfg.Topology.LocalEpochInterval)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		idle := true
		for _, r := range readers {
			rctx, cancel := context.WithTimeout(ctx, window+2*time.Second)
			first, err1 := r.ReadBackground(rctx)
			sleep(rctx, window)
			last, err2 := r.ReadBackground(rctx)
			cancel()
			idle = idle && err1 == nil && err2 == nil && last-first <= full/4
		}
		if idle {
			return true
		}
	}
	return false
}

// raftIdleWithin bounds how long a quiet spell waits for a range's Raft
// clock to idle once the epochs have: its leader idles after a second
// without an entry, and a GC chunk (about every 2 s per range at a
// campaign's 3 s gc_ttl) or a lease renewal (every 4 s or so at the idle
// epoch pace) wakes it for that long again, so in some spells it never
// does.
const raftIdleWithin = 8 * time.Second

// idleRaft waits, in a quiet spell, until every running replica of group
// ticks its Raft clock at the idle pace (localcluster.Cluster.Idle), and
// reports whether that happened within raftIdleWithin.
func (cp *campaign) idleRaft(ctx context.Context, group uint64) bool {
	deadline := time.Now().Add(raftIdleWithin)
	for time.Now().Before(deadline) {
		if cp.c.Idle(group) {
			return true
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return false
		}
	}
	return false
}
