package rangeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/epoch"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/storage"
)

// subGC holds the range's GC threshold (a marshalled pb.GCThreshold).
const subGC byte = 'g'

// ErrSnapshotTooOld: a snapshot read below the range's GC threshold, whose
// versions may be collected (DESIGN.md §14). The message names the horizon.
var ErrSnapshotTooOld = errors.New("rangeserver: snapshot below the GC horizon")

// GCResult is what one applied GC chunk did.
type GCResult struct {
	Stats storage.GCStats
	// Resume is the key the next chunk starts from; nil when the chunk
	// reached the end of the range's span.
	Resume []byte
}

// GCThreshold returns the range's GC threshold. It is shared: callers must
// not modify it.
func (sm *StateMachine) GCThreshold() *pb.GCThreshold { return sm.gc.Load() }

// checkSnapshotAge refuses a snapshot read at epoch `at` of keyspace ks
// below the GC threshold.
func (sm *StateMachine) checkSnapshotAge(ks Keyspace, at uint64) error {
	t := sm.GCThreshold()
	h := t.GetHorizon()
	if ks == RegionalVersions {
		h = t.GetRegionalHorizon()
	}
	if at < h {
		return fmt.Errorf("%w: range %d collected versions below epoch %d; the snapshot reads at %d", ErrSnapshotTooOld, sm.desc.Load().GetRangeId(), h, at)
	}
	return nil
}

// raiseGC raises the stored GC threshold to t's horizons, in b and in
// memory. Called with sm.mu held.
func (sm *StateMachine) raiseGC(b *pebble.Batch, t *pb.GCThreshold) {
	cur := sm.gc.Load()
	if t.GetHorizon() <= cur.GetHorizon() && t.GetRegionalHorizon() <= cur.GetRegionalHorizon() {
		return
	}
	next := &pb.GCThreshold{Horizon: max(cur.GetHorizon(), t.GetHorizon()), RegionalHorizon: max(cur.GetRegionalHorizon(), t.GetRegionalHorizon())}
	v, _ := proto.Marshal(next)
	_ = b.Set(sm.sub(subGC, nil), v, nil)
	sm.gc.Store(next)
}

// applyGC applies a GC chunk (DESIGN.md §14), with sm.mu held: the
// threshold rises first, in the same batch as the deletions, so no read
// below it is served once a version below it may be gone.
func (sm *StateMachine) applyGC(b *pebble.Batch, cmd *pb.GCCmd) any {
	d := sm.desc.Load()
	if d.GetSubsumed() {
		return Applied{Rejected: true}
	}
	regional := cmd.GetRegionalHorizon()
	if home := cmd.GetRegion(); home != "" && home != d.GetRegion() {
		regional = 0 // counted in the local epochs of a home the range left
	}
	sm.raiseGC(b, &pb.GCThreshold{Horizon: cmd.GetHorizon(), RegionalHorizon: regional})
	start := d.GetStartKey()
	if k := cmd.GetStartKey(); bytes.Compare(k, start) > 0 {
		start = k
	}
	var end []byte
	if len(d.GetEndKey()) > 0 {
		end = d.GetEndKey()
		if bytes.Compare(start, end) >= 0 {
			return Applied{GC: &GCResult{}}
		}
	}
	prefix, horizon := dataPrefix, cmd.GetHorizon()
	if cmd.GetRegional() {
		prefix, horizon = regionalPrefix, regional
	}
	if horizon == 0 {
		return Applied{GC: &GCResult{}}
	}
	stats, resume, err := sm.e.CollectMVCC(b, prefix, start, end, storage.EpochStart(horizon), int(cmd.GetMaxKeys()))
	if err != nil {
		return err
	}
	return Applied{GC: &GCResult{Stats: stats, Resume: resume}}
}

// loadGC reads the stored GC threshold through get (the engine or a batch).
func (sm *StateMachine) loadGC(get func([]byte) ([]byte, error)) error {
	t := &pb.GCThreshold{}
	v, err := get(sm.sub(subGC, nil))
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(v, t); err != nil {
		return fmt.Errorf("%w: GC threshold: %v", storage.ErrCorrupt, err)
	}
	sm.gc.Store(t)
	return nil
}

// batchGet reads k through b (nil if absent).
func batchGet(b *pebble.Batch, k []byte) ([]byte, error) {
	v, closer, err := b.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// gcChunkKeys bounds the user keys one GC command examines, so that one
// apply holds the range's Raft loop briefly whatever the range's size.
const gcChunkKeys = 1000

// CollectGarbage collects the range's versions below horizon (global
// epochs; regional, if non-zero, for the regional copies in local epochs),
// on the leader, as a sequence of GC commands of at most gcChunkKeys keys
// each (DESIGN.md §14). The caller guarantees that no snapshot still
// needs an epoch below the horizons. Errors: ErrNotLeaseholder (not the
// leader), or the proposal's error; chunks applied before an error stay
// applied, and the threshold stays raised.
func (r *Replica) CollectGarbage(ctx context.Context, horizon, regional uint64) (storage.GCStats, error) {
	return r.collectGarbage(ctx, horizon, regional, r.home.Load().Region)
}

// collectGarbage is CollectGarbage with regional in home's local epochs: a
// chunk that applies once the range has another home raises no regional
// horizon.
func (r *Replica) collectGarbage(ctx context.Context, horizon, regional uint64, home string) (storage.GCStats, error) {
	var total storage.GCStats
	for _, onRegional := range []bool{false, true} {
		if onRegional && regional == 0 {
			break
		}
		for start := []byte(nil); ; {
			if _, err := r.leader(); err != nil {
				return total, err
			}
			cmd := &pb.Command{Cmd: &pb.Command_Gc{Gc: &pb.GCCmd{Horizon: horizon, RegionalHorizon: regional,
				StartKey: start, MaxKeys: gcChunkKeys, Regional: onRegional, Region: home}}}
			pctx, cancel := context.WithTimeout(ctx, proposeTimeout)
			res, err := r.group.Propose(pctx, EncodeCommand(cmd))
			cancel()
			if err != nil {
				return total, err
			}
			if err, ok := res.(error); ok {
				return total, err
			}
			a, _ := res.(Applied)
			if a.GC == nil {
				return total, fmt.Errorf("%w: range %d is subsumed", ErrMergeRaced, r.id)
			}
			total.Add(a.GC.Stats)
			if a.GC.Resume == nil {
				break
			}
			start = a.GC.Resume
		}
	}
	return total, nil
}

// GCPolicy is a region's GC policy as a range leader applies it
// (DESIGN.md §14).
type GCPolicy struct {
	// TTL is how long a replaced version stays readable (0: never collect).
	TTL time.Duration
	// Protected is the oldest epoch a live protection (a backup, a
	// changefeed) needs, when Protects is set: the horizon stays at or
	// below it.
	Protected uint64
	Protects  bool
}

// GCPolicySource is where a range leader learns its region's GC policy.
type GCPolicySource interface {
	// Cached returns the policy last read, without waiting (false: none
	// read yet; the leader does not collect).
	Cached() (GCPolicy, bool)
	// Fetch reads the policy now, linearizably: a leader reads it right
	// before it collects, so a protection registered before that read is
	// honoured.
	Fetch(ctx context.Context) (GCPolicy, error)
}

// gcCheck is how often a leader samples the epochs for its GC horizon.
const gcCheck = time.Second

// gcQueue is a leader's GC schedule: epoch samples, and at most one
// collection at a time.
type gcQueue struct {
	lastCheck time.Time     // read and written by the tick loop only
	lastRun   time.Time     // likewise
	samples   []epochSample // likewise; oldest first
	running   atomic.Bool
}

// epochSample is the epochs a leader saw at one time: the data's (global,
// or local in a regional-only deployment) and the regional copies' (local;
// 0 without a publisher).
type epochSample struct {
	at             time.Time
	data, regional uint64
	home           string // the region whose local epoch regional is
}

// gcEvery is how often a leader collects once its horizon moves: an
// eighth of the TTL, at most every 5 minutes and at least every gcCheck.
func gcEvery(ttl time.Duration) time.Duration { return max(min(ttl/8, 5*time.Minute), gcCheck) }

// horizonAt returns the newest sample taken at least ttl before now, and
// drops the samples older than it (they can no longer be the horizon).
func (q *gcQueue) horizonAt(now time.Time, ttl time.Duration) (epochSample, bool) {
	i := -1
	for j, s := range q.samples {
		if now.Sub(s.at) < ttl {
			break
		}
		i = j
	}
	if i < 0 {
		return epochSample{}, false
	}
	q.samples = q.samples[i:]
	return q.samples[0], true
}

// maybeGC, on the leader's tick at most every gcCheck, samples the epochs
// (local epoch `local`, as the tick read it) and, once the epochs of GCTTL
// ago are above the range's threshold and gcEvery passed since the last
// run, collects below them in the background (DESIGN.md §14). A new
// leader starts sampling afresh, so it collects only once it has led for
// GCTTL; a snapshot older than GCTTL may then fail with ErrSnapshotTooOld.
func (r *Replica) maybeGC(local uint64) {
	now := r.cfg.Clock.Now()
	if now.Sub(r.gcq.lastCheck) < gcCheck {
		return
	}
	ttl := r.cfg.GCTTL
	if r.home.Load().GCPolicy != nil {
		p, ok := r.home.Load().GCPolicy.Cached()
		if !ok {
			return
		}
		ttl = p.TTL
	}
	if ttl <= 0 {
		return
	}
	r.gcq.lastCheck = now
	s := epochSample{at: now, data: local, home: r.home.Load().Region}
	if r.src().Publisher != nil {
		ctx, cancel := context.WithTimeout(r.ctx, time.Second)
		g, err := epoch.ReadBackground(ctx, r.src().Publisher)
		cancel()
		if err != nil {
			return
		}
		s.data, s.regional = g, local
	}
	r.gcq.samples = append(r.gcq.samples, s)
	h, ok := r.gcq.horizonAt(now, ttl)
	th := r.sm.GCThreshold()
	if !ok || (h.data <= th.GetHorizon() && h.regional <= th.GetRegionalHorizon()) ||
		now.Sub(r.gcq.lastRun) < gcEvery(ttl) || r.gcq.running.Load() {
		return
	}
	r.gcq.lastRun = now
	r.gcq.running.Store(true)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.gcq.running.Store(false)
		if !r.applyPolicy(&h, ttl) {
			return
		}
		began := time.Now()
		stats, err := r.collectGarbage(r.ctx, h.data, h.regional, h.home)
		if err != nil {
			slog.Debug("garbage collection", "range", r.id, "horizon", h.data, "err", err)
			return
		}
		slog.Debug("garbage collection", "range", r.id, "horizon", h.data, "regional_horizon", h.regional,
			"keys", stats.Keys, "versions", stats.Versions, "bytes", stats.Bytes, "took", time.Since(began))
	}()
}

// applyPolicy reads the region's GC policy afresh and lowers the horizon
// sample h to its protections. It reports false (do not collect) when the
// read fails, when the gc_ttl grew past ttl (the one h was chosen by), or
// when nothing is left to collect.
func (r *Replica) applyPolicy(h *epochSample, ttl time.Duration) bool {
	if r.home.Load().GCPolicy == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(r.ctx, proposeTimeout)
	p, err := r.home.Load().GCPolicy.Fetch(ctx)
	cancel()
	if err != nil || p.TTL <= 0 || p.TTL > ttl {
		return false
	}
	if p.Protects {
		h.data = min(h.data, p.Protected)
	}
	th := r.sm.GCThreshold()
	return h.data > th.GetHorizon() || h.regional > th.GetRegionalHorizon()
}
