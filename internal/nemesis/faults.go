package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/topology"
)

// Fault kinds.
const (
	faultKillNode      = "kill and restart a node"
	faultKillLeader    = "kill and restart a range leader"
	faultCutRegion     = "cut a region off"
	faultDrop          = "drop 10% of messages"
	faultDuplicate     = "duplicate 20% of messages"
	faultDelay         = "delay every message 20 ms"
	faultRestartAll    = "kill every node at once and restart from disk"
	faultExclude       = "exclude a cut-off region and readmit it"
	faultPrepared      = "kill a participant's leader between prepare and commit record"
	faultPreparedCrash = "kill a participant's leader and the coordinator between prepare and commit record"
	faultDecided       = "kill a participant's leader between commit record and notification"
	faultDecidedCrash  = "kill a participant's leader and the coordinator between commit record and notification"
	faultSplit         = "split a range under load"
	faultSplitKill     = "split a range and kill its leader as the split applies"
	faultMerge         = "merge two ranges under load"
	faultMergeKill     = "merge two ranges and kill the leader as the merge applies"
	faultMergeMove     = "merge two ranges while a replica of the left one moves"
	faultDirectory     = "kill a region's directory leader and split a range there"
	faultStall         = "stall a coordinator between prepare and commit record past the record grace"
	faultStallBrief    = "stall a coordinator between prepare and commit record for 0.5 s"
	faultPauseClose    = "pause a range's closing of epochs"
	faultRotateCerts   = "rotate every node's certificate in place and restart a node"
	faultTransferLease = "transfer a range's lease to another replica under load"
	faultMoveReplica   = "move a replica to another node of its region under load"
	faultMoveKill      = "kill a range's leader during a replica move"
	faultAddNode       = "add a node to a region under load"
	faultDecommission  = "decommission a node under load and stop it once gone"
	faultMoveGroup     = "move an epoch/txn-state/directory group's replica under load"
	faultLeaveBehind   = "kill a node and move a replica off it; restart it and its left-behind replica must be collected"
	faultStarve        = "starve a range's follower or non-voter of the log while it answers reads"
	faultMoveStarved   = "starve a range's follower of the log and move its replica off it; it keeps the replica until the range leaves the joint configuration"
	faultMoveNonVoter  = "move a non-voting replica to another node of its region under load"
	faultCutNonVoter   = "cut off the region of a non-voting replica; once healed it must serve again"
	faultPlacement     = "change a placement rule under load"
	faultRehome        = "rehome a range to another region under load"
	faultQuietKill     = "hush the load until the epochs and a range's Raft clock idle and then kill its leader"
	faultHoldSide      = "deliver side-transported closes up to 1.5 s late while a lease moves"
	faultStarveLog     = "starve a range's follower or non-voter of the log alone and idle the range so its closes go outside the log"
	faultDiskStall     = "stall a range leader's disk: its fsyncs wait 1–2 s under load"
	faultDiskStallKill = "stall a range leader's disk and kill it while its fsyncs wait"
)

// FaultKinds lists every kind of fault a campaign injects.
var FaultKinds = []string{faultKillNode, faultKillLeader, faultCutRegion, faultDrop, faultDuplicate, faultDelay,
	faultRestartAll, faultExclude, faultPrepared, faultPreparedCrash, faultDecided, faultDecidedCrash,
	faultSplit, faultSplitKill, faultMerge, faultMergeKill, faultMergeMove, faultDirectory, faultStall, faultStallBrief, faultPauseClose, faultRotateCerts,
	faultTransferLease, faultMoveReplica, faultMoveKill, faultAddNode, faultDecommission, faultMoveGroup, faultLeaveBehind,
	faultStarve, faultMoveNonVoter, faultCutNonVoter, faultPlacement, faultRehome, faultQuietKill, faultHoldSide, faultStarveLog,
	faultDiskStall, faultDiskStallKill, faultMoveStarved}

// reshapes lists the faults after which the directories must agree with
// the ranges (checkDirectories).
var reshapes = map[string]bool{faultSplit: true, faultSplitKill: true, faultMerge: true, faultMergeKill: true, faultMergeMove: true, faultDirectory: true}

// midCommit describes the faults that strike inside two-phase commit.
var midCommit = map[string]struct {
	point          client.CrashPoint
	coordinatorDie bool
}{
	faultPrepared:      {client.CrashAfterPrepare, false},
	faultPreparedCrash: {client.CrashAfterPrepare, true},
	faultDecided:       {client.CrashAfterCommitRecord, false},
	faultDecidedCrash:  {client.CrashAfterCommitRecord, true},
}

// Bounds on recovery.
const (
	// orphanAfter is the cluster's bound on a silent coordinator (OrphanAfter).
	orphanAfter = time.Second
	// txnRecordGrace is the cluster's txn_record_grace: short, so the
	// txn-state leaders forget left-behind records while the faults strike.
	txnRecordGrace = 2 * time.Second
	// stallFor is how long faultStall pauses a coordinator: past the orphan
	// bound, the participants' abort, and the grace after which its record
	// is forgotten.
	stallFor = orphanAfter + txnRecordGrace + 2*time.Second
	// briefStall is how long faultStallBrief pauses a coordinator: under
	// the orphan bound, so it commits, at the epoch its participants'
	// prepares allowed; their closed epochs must wait for it.
	briefStall = orphanAfter / 2
	// releaseBound is how long after a mid-commit kill every participant may
	// still hold the transaction's locks: the fault's hold (≤ 2 s), leader
	// failover, orphanAfter, and resolution through the state store.
	releaseBound = 15 * time.Second
	// recoveryBound is how long after healing every data region must commit.
	recoveryBound = 30 * time.Second
)

// armedCrash is a mid-commit fault waiting for the next two-phase commit to
// reach its point.
type armedCrash struct {
	point          client.CrashPoint
	coordinatorDie bool
	pick           int // which participant's leader to kill (mod their number)
	fired          chan firedCrash
}

// firedCrash is what an armed crash struck: the transaction, its
// participants, and the node killed (0: their leader was not found).
type firedCrash struct {
	txn    []byte
	ranges []uint64
	node   uint64
	at     time.Time
}

// crashHook is every client's crash hook: it fires the armed fault, if any,
// at its point, killing a participant's leader there.
func (cp *campaign) crashHook(p client.CrashPoint, txn []byte, ranges []uint64) bool {
	cp.mu.Lock()
	a := cp.armed
	if a == nil || a.point != p {
		cp.mu.Unlock()
		return false
	}
	cp.armed = nil
	cp.mu.Unlock()
	f := firedCrash{txn: append([]byte(nil), txn...), ranges: ranges, node: cp.c.Leader(ranges[a.pick%len(ranges)]), at: time.Now()}
	if f.node != 0 {
		if err := cp.c.KillNode(f.node); err != nil {
			cp.anomaly("stopping node %d mid-commit: %v", f.node, err)
			f.node = 0
		}
	}
	a.fired <- f
	return a.coordinatorDie
}

// faults injects one fault every FaultEvery until ctx ends, heals it, and
// measures the recovery. The kinds are dealt from a shuffled deck, so every
// kind is drawn once before any is drawn again; a kind that found nothing
// to strike (no non-voter to move, say) goes back into the deck.
func (cp *campaign) faults(ctx context.Context, dbs []*client.DB) {
	r := rand.New(rand.NewPCG(cp.cfg.Seed, 999))
	net := cp.c.Dialer(cp.regions[0]).Network()
	ranges := cp.cfg.Topology.Ranges()
	var deck []string
	undrawn := "" // the kind drawn last, until it strikes
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(cp.cfg.FaultEvery):
		}
		nodes := cp.c.NodeIDs() // nodes join and leave
		if len(nodes) == 0 {
			continue
		}
		if len(deck) == 0 { // a fresh deck holds every kind, the undrawn one too
			deck, undrawn = slices.Clone(cp.cfg.Faults), ""
			if len(deck) == 0 {
				deck = slices.Clone(FaultKinds)
			}
			r.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		if undrawn != "" { // it found nothing to strike: back into the deck, not first
			deck = slices.Insert(deck, 1+r.IntN(len(deck)), undrawn)
		}
		kind := deck[0]
		deck, undrawn = deck[1:], deck[0]
		at := cp.drawn(kind)
		hold := time.Second + time.Duration(r.IntN(1000))*time.Millisecond
		var heal func() error
		var struck *firedCrash
		switch kind {
		case faultKillNode, faultKillLeader:
			id := nodes[r.IntN(len(nodes))]
			if kind == faultKillLeader {
				if l := cp.c.Leader(ranges[r.IntN(len(ranges))].ID); l != 0 {
					id = l
				}
			}
			if err := cp.c.KillNode(id); err != nil {
				cp.anomaly("stopping node %d: %v", id, err)
				continue
			}
			heal = func() error { return cp.c.RestartNode(id) }
		case faultDiskStall, faultDiskStallKill:
			// The leader's Ready loop waits on its append's fsync, having
			// sent the entries (a leader sends before it persists): its
			// followers may commit them and elect another leader, and a
			// kill while the fsyncs wait loses what the leader wrote since
			// its last sync, which the others' logs must make up.
			id := cp.c.Leader(ranges[r.IntN(len(ranges))].ID)
			n := cp.c.Node(id)
			if n == nil {
				continue
			}
			stall := n.HoldSyncs()
			if stall == nil {
				continue // a store not crashable: nothing to hold
			}
			heal = func() error { stall.Release(); return nil }
			if kind == faultDiskStallKill {
				heal = func() error {
					if err := cp.c.KillNode(id); err != nil { // the crash ends the hold, nothing synced
						return err
					}
					return cp.c.RestartNode(id)
				}
			}
		case faultQuietKill:
			// Epochs at their idle pace (epoch.Pace), and a range's Raft
			// clock at its own (raftgroup's idle.go), then its leader
			// dies: its followers must elect another at the idle pace, the
			// successor must bring the epochs' pace back to take over,
			// and the first operations after the spell meet the change.
			end := cp.hush()
			idle := cp.idleEpochs(ctx)
			if ctx.Err() != nil {
				end() // the campaign ended meanwhile: no fault
				continue
			}
			if idle {
				cp.count("quiet spell, epochs idle")
			} else {
				cp.count("quiet spell, epochs not idle")
			}
			group := ranges[r.IntN(len(ranges))].ID
			if cp.idleRaft(ctx, group) {
				cp.count("quiet spell, the range's Raft clock idle")
			} else {
				cp.count("quiet spell, the range's Raft clock not idle")
			}
			id := cp.c.Leader(group)
			if id == 0 {
				end()
				continue
			}
			if err := cp.c.KillNode(id); err != nil {
				end()
				cp.anomaly("stopping node %d: %v", id, err)
				continue
			}
			heal = func() error { defer end(); return cp.c.RestartNode(id) }
		case faultCutRegion:
			net.CutRegion(cp.regions[r.IntN(len(cp.regions))])
			heal = func() error { net.Heal(); return nil }
		case faultDrop:
			net.SetDropRate(0.1)
			heal = func() error { net.Heal(); return nil }
		case faultDuplicate:
			net.SetDuplicateRate(0.2)
			heal = func() error { net.Heal(); return nil }
		case faultDelay:
			net.SetExtraDelay(20 * time.Millisecond)
			heal = func() error { net.Heal(); return nil }
		case faultRestartAll:
			var errs []error
			for _, id := range nodes {
				errs = append(errs, cp.c.KillNode(id))
			}
			if err := errors.Join(errs...); err != nil {
				cp.anomaly("stopping every node: %v", err)
			}
			heal = func() error {
				var errs []error
				for _, id := range nodes {
					errs = append(errs, cp.c.RestartNode(id))
				}
				return errors.Join(errs...)
			}
		case faultSplit, faultSplitKill:
			left, ok := cp.split(ctx, dbs[0], cp.splitKey(r))
			if !ok {
				continue
			}
			heal = func() error { return nil }
			if kind == faultSplitKill {
				// The leaseholder of both halves, right after the split applied
				// there and while the right-hand range elects its first leader.
				if id := cp.c.Leader(left.ID); id != 0 {
					if err := cp.c.KillNode(id); err != nil {
						cp.anomaly("stopping node %d after a split: %v", id, err)
						continue
					}
					heal = func() error { return cp.c.RestartNode(id) }
				}
			}
		case faultDirectory:
			// The split's range ID waits for a new directory leader, and its
			// descriptors reach the directory through it or, if that write
			// is lost, through the reconciliation.
			key := cp.splitKey(r)
			home, _ := cp.cfg.Topology.RangeFor(key)
			dir := cp.cfg.Topology.GroupsOfKind(topology.KindDirectory, home.Region)
			if len(dir) == 0 {
				continue
			}
			id := cp.c.Leader(dir[0].ID)
			if id == 0 {
				continue
			}
			if err := cp.c.KillNode(id); err != nil {
				cp.anomaly("stopping node %d: %v", id, err)
				continue
			}
			heal = func() error { return cp.c.RestartNode(id) }
			cp.split(ctx, dbs[0], key)
		case faultMerge, faultMergeKill:
			key := cp.splitKey(r)
			mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			merged, err := dbs[0].AdminMerge(mctx, key)
			cancel()
			switch {
			case errors.Is(err, client.ErrMergeLast), errors.Is(err, client.ErrMergeRegions), errors.Is(err, client.ErrMergeReplicas):
				continue // no neighbour to absorb here: no fault this time
			case client.IsRetryable(err) || errors.Is(err, client.ErrCommitUnknown) || ctx.Err() != nil:
				continue // a range was busy, or the campaign is ending
			case err != nil:
				cp.anomaly("merging at %q: %v", key, err)
				continue
			}
			heal = func() error { return nil }
			if kind == faultMergeKill {
				// The merged range's leader, right after the merge applied
				// there and while the other replicas remove the subsumed one.
				if id := cp.c.Leader(merged.ID); id != 0 {
					if err := cp.c.KillNode(id); err != nil {
						cp.anomaly("stopping node %d after a merge: %v", id, err)
						continue
					}
					heal = func() error { return cp.c.RestartNode(id) }
				}
			}
		case faultMergeMove:
			// A replica the move adds gets a snapshot of the left range's
			// span only: a merge applied before it caught up would leave
			// it serving the right range's keys empty (the reads, the
			// final reads and the replica digests find that).
			if !cp.mergeDuringMove(ctx, r, dbs[0]) {
				continue
			}
			heal = func() error { return nil }
		case faultExclude:
			region := cp.regions[r.IntN(len(cp.regions))]
			net.CutRegion(region)
			if err := cp.setExcluded(region, true); err != nil {
				net.Heal()
				cp.anomaly("excluding %s: %v", region, err)
				continue
			}
			heal = func() error {
				net.Heal()
				return cp.setExcluded(region, false)
			}
		case faultStall:
			cp.stallCommit(ctx)
			heal = func() error { return nil }
		case faultStallBrief:
			// The next two-phase commit of one workload client stalls once.
			db := dbs[r.IntN(len(dbs))]
			var once atomic.Bool
			db.SetStallHook(func([]byte, []uint64) time.Duration {
				if once.CompareAndSwap(false, true) {
					return briefStall
				}
				return 0
			})
			heal = func() error { db.SetStallHook(nil); return nil }
		case faultRotateCerts:
			// New certificates everywhere, then a node restarts: every
			// connection to and from it handshakes again, with the new ones.
			if err := cp.c.RotateNodeCerts(); err != nil {
				cp.anomaly("rotating the certificates: %v", err)
				continue
			}
			id := nodes[r.IntN(len(nodes))]
			if err := cp.c.KillNode(id); err != nil {
				cp.anomaly("stopping node %d: %v", id, err)
				continue
			}
			heal = func() error { return cp.c.RestartNode(id) }
		case faultTransferLease:
			if !cp.transferLease(ctx, dbs[0], cp.splitKey(r), r.Perm(len(nodes)), nodes) {
				continue
			}
			heal = func() error { return nil }
		case faultMoveReplica:
			if moved, _ := cp.moveReplica(ctx, r, dbs[0], cp.splitKey(r), 0); !moved {
				continue
			}
			heal = func() error { return nil }
		case faultAddNode:
			if cp.addNode(ctx, r) == 0 {
				continue
			}
			heal = func() error { return nil }
		case faultDecommission:
			if !cp.decommission(ctx, r) {
				continue
			}
			heal = func() error { return nil }
		case faultMoveGroup:
			if !cp.moveGroup(ctx, r) {
				continue
			}
			heal = func() error { return nil }
		case faultLeaveBehind:
			killed, rangeID := cp.leaveBehind(ctx, r, dbs[0], cp.splitKey(r))
			if killed == 0 {
				continue
			}
			heal = func() error {
				if err := cp.c.RestartNode(killed); err != nil {
					return err
				}
				cp.awaitCollected(ctx, killed, rangeID)
				return nil
			}
		case faultMoveStarved:
			starved, rangeID := cp.moveStarved(ctx, r, dbs[0], cp.splitKey(r), net.StarveLog)
			if starved == 0 {
				continue
			}
			heal = func() error {
				net.Heal()
				cp.awaitCollected(ctx, starved, rangeID)
				return nil
			}
		case faultMoveKill:
			_, killed := cp.moveReplica(ctx, r, dbs[0], cp.splitKey(r), time.Duration(r.IntN(150))*time.Millisecond)
			if killed == 0 {
				continue
			}
			heal = func() error { return cp.c.RestartNode(killed) }
		case faultHoldSide:
			// Idle ranges' closes reach their followers late, after the
			// lease they were made under may have moved (DESIGN.md §13;
			// rangeserver/sideclosed.go): stale when they land, they must
			// still be true.
			cp.holdSideClosed(nodes, time.Duration(500+r.IntN(1000))*time.Millisecond)
			cp.transferLease(ctx, dbs[0], cp.splitKey(r), r.Perm(len(nodes)), nodes)
			heal = func() error { cp.holdSideClosed(nodes, 0); return nil }
		case faultPauseClose:
			id := ranges[r.IntN(len(ranges))].ID
			cp.pauseClosing(nodes, id, true)
			heal = func() error { cp.pauseClosing(nodes, id, false); return nil }
		case faultPlacement:
			if !cp.changePlacement(ctx, r, dbs[0]) {
				continue
			}
			heal = func() error { return nil }
		case faultStarve:
			if cp.starveFollower(r, ranges, net.Starve) == 0 {
				continue
			}
			heal = func() error { net.Heal(); return nil }
		case faultStarveLog:
			// A replica that hears the range's side-transported closes
			// but not its log (DESIGN.md §13; rangeserver/sideclosed.go):
			// the load writes past what it applied, then a quiet spell
			// idles the range, whose closes then travel outside the log
			// naming an index the replica has not applied. It must not
			// trust them: once the load resumes, its follower reads must
			// still see every write.
			if cp.starveFollower(r, ranges, net.StarveLog) == 0 {
				continue
			}
			sleep(ctx, 500*time.Millisecond)
			end := cp.hush()
			sleep(ctx, time.Duration(1000+r.IntN(1000))*time.Millisecond)
			end()
			heal = func() error { net.Heal(); return nil }
		case faultRehome:
			if !cp.rehomeRange(ctx, r, dbs[r.IntN(len(dbs))], ranges) {
				continue
			}
			heal = func() error { return nil }
		case faultMoveNonVoter:
			if !cp.moveNonVoter(ctx, r, dbs[r.IntN(len(dbs))], ranges) {
				continue
			}
			heal = func() error { return nil }
		case faultCutNonVoter:
			d, node, ok := cp.pickNonVoter(r, ranges)
			i := slices.Index(cp.regions, cp.nodeRegion(node))
			if !ok || i < 0 {
				continue
			}
			net.CutRegion(cp.regions[i])
			heal = func() error {
				net.Heal()
				cp.awaitNonVoterServes(ctx, cp.followers[i], d, node)
				return nil
			}
		default:
			f, ok := cp.strikeMidCommit(ctx, kind, r.IntN(8))
			if !ok {
				continue // no two-phase commit came by
			}
			struck = &f
			heal = func() error {
				if f.node == 0 {
					return nil
				}
				return cp.c.RestartNode(f.node)
			}
		}
		undrawn = ""
		cp.mu.Lock()
		cp.sum.Faults[kind]++
		cp.sum.Timeline[at].Struck = true
		cp.mu.Unlock()
		time.Sleep(hold)
		if err := heal(); err != nil {
			cp.anomaly("healing %q: %v", kind, err)
			continue
		}
		healed := time.Now()
		cp.mu.Lock()
		cp.sum.Timeline[at].Healed = healed.Sub(cp.start)
		cp.mu.Unlock()
		cp.checkQuorums()
		if err := cp.probe(dbs); err != nil {
			cp.anomaly("no recovery within %v after %q: %v", recoveryBound, kind, err)
			continue
		}
		cp.mu.Lock()
		if cp.sum.Recovery[kind] == nil {
			cp.sum.Recovery[kind] = latency.New()
		}
		cp.sum.Recovery[kind].Since(healed)
		cp.mu.Unlock()
		if reshapes[kind] {
			if err := cp.checkDirectories(ctx); err != nil {
				cp.anomaly("after %q: %v", kind, err)
			}
		}
		if struck != nil {
			cp.awaitRelease(*struck)
		}
	}
}

// The filler mergeDuringMove writes: fillerValues values of
// fillerValueBytes each.
const (
	fillerValues     = 16
	fillerValueBytes = 512 << 10
)

// mergeDuringMove splits a random region's filler range off on its right,
// moves a replica of it and, while the move is under way, merges it with
// that right-hand neighbour; it reports whether the move or the merge
// happened. A merge refused while the move holds the range (busy,
// retried until its deadline) is expected.
func (cp *campaign) mergeDuringMove(ctx context.Context, r *rand.Rand, db *client.DB) bool {
	// The range holding the filler, about 8 MiB (rewritten each time; the
	// old versions are collected): its snapshot streams for about 250 ms
	// at the default rate, long enough for the merge to meet the move.
	key := cp.key(r.IntN(len(cp.keys)), "nemesis-filler")
	blob := make([]byte, fillerValueBytes)
	for i := range fillerValues {
		for j := range blob {
			blob[j] = byte(r.Uint32())
		}
		if _, err := db.Put(ctx, fmt.Appendf(slices.Clone(key), "-%02d", i), blob); err != nil {
			return false
		}
	}
	// A right-hand neighbour of the same region to merge with, split off
	// right after the filler (a split there already is refused: fine).
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_ = db.AdminSplit(sctx, append(slices.Clone(key), '~'))
	cancel()
	pause := time.Duration(r.IntN(300)) * time.Millisecond // the learner joins, its snapshot streams
	moved := make(chan bool, 1)
	go func() { // r is the move's until it ends
		m, _ := cp.moveReplica(ctx, r, db, key, 0)
		moved <- m
	}()
	time.Sleep(pause)
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := db.AdminMerge(mctx, key)
	cancel()
	switch {
	case err == nil:
		cp.count("merge during a replica move: merged")
	case errors.Is(err, client.ErrMergeLast), errors.Is(err, client.ErrMergeRegions), errors.Is(err, client.ErrMergeReplicas),
		client.IsRetryable(err), errors.Is(err, client.ErrCommitUnknown), ctx.Err() != nil:
		cp.count("merge during a replica move: refused")
	default:
		cp.anomaly("merging at %q during a replica move: %v", key, err)
	}
	m := <-moved
	if m {
		cp.count("merge during a replica move: the move done")
	}
	return m || err == nil
}

// drawn adds kind, drawn now, to the summary's timeline and returns its
// index there.
func (cp *campaign) drawn(kind string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.sum.Timeline = append(cp.sum.Timeline, FaultEvent{Kind: kind, Began: time.Since(cp.start)})
	return len(cp.sum.Timeline) - 1
}

// pauseClosing stops (or resumes) the closing of epochs at every live
// replica of range id: its changefeed resolves nothing past its closed
// epoch meanwhile. A replica restarted meanwhile closes as usual.
func (cp *campaign) pauseClosing(nodes []uint64, id uint64, paused bool) {
	for _, n := range nodes {
		if nd := cp.c.Node(n); nd != nil {
			if rep := nd.Range(id); rep != nil {
				rep.PauseClosing(paused)
			}
		}
	}
}

// holdSideClosed makes every running node's side-transported closes wait
// d before they are sent (0: no wait).
func (cp *campaign) holdSideClosed(nodes []uint64, d time.Duration) {
	for _, n := range nodes {
		if nd := cp.c.Node(n); nd != nil {
			nd.HoldSideClosed(d)
		}
	}
}

// strikeMidCommit arms a mid-commit fault and waits up to 5 s for a
// two-phase commit to reach its point.
func (cp *campaign) strikeMidCommit(ctx context.Context, kind string, pick int) (firedCrash, bool) {
	m := midCommit[kind]
	a := &armedCrash{point: m.point, coordinatorDie: m.coordinatorDie, pick: pick, fired: make(chan firedCrash, 1)}
	cp.mu.Lock()
	cp.armed = a
	cp.mu.Unlock()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	select {
	case f := <-a.fired:
		return f, true
	case <-timer.C:
	case <-ctx.Done():
	}
	cp.mu.Lock()
	disarmed := cp.armed == a
	cp.armed = nil
	cp.mu.Unlock()
	if !disarmed { // it fired as we gave up
		return <-a.fired, true
	}
	return firedCrash{}, false
}

// awaitRelease waits until no participant of a transaction struck mid-commit
// holds its locks, and records how long after the kill that was.
func (cp *campaign) awaitRelease(f firedCrash) {
	for cp.holds(f.txn, f.ranges) {
		if time.Since(f.at) > releaseBound {
			cp.anomaly("transaction %x struck mid-commit still holds locks %v after the kill", f.txn, releaseBound)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	cp.mu.Lock()
	cp.sum.Released.Since(f.at)
	cp.mu.Unlock()
}

// holds reports whether a replica of any of ranges on a running node holds
// locks of txn.
func (cp *campaign) holds(txn []byte, ranges []uint64) bool {
	for _, id := range cp.c.NodeIDs() {
		n := cp.c.Node(id)
		for _, rg := range ranges {
			if n == nil {
				continue
			}
			if rep := n.Range(rg); rep != nil && rep.HoldsLocks(txn) {
				return true
			}
		}
	}
	return false
}

// drainLocks checks, once the load has stopped and the faults are healed,
// that every lock is released within releaseBound: whatever is still held
// belongs to a transaction whose coordinator is gone.
func (cp *campaign) drainLocks() {
	deadline := time.Now().Add(releaseBound)
	for {
		held := 0
		for _, id := range cp.c.NodeIDs() {
			if n := cp.c.Node(id); n != nil {
				for _, id := range n.RangeIDs() { // splits' ranges too
					if rep := n.Range(id); rep != nil {
						held += rep.Locks()
					}
				}
			}
		}
		if held == 0 {
			return
		}
		if time.Now().After(deadline) {
			cp.anomaly("%d locks still held %v after the load stopped", held, releaseBound)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setExcluded excludes region from the global epoch service's set, or
// readmits it, if the topology has a global epoch service.
func (cp *campaign) setExcluded(region string, excluded bool) error {
	global := cp.cfg.Topology.GroupsOfKind(topology.KindGlobalEpoch, "")
	if len(global) == 0 || len(cp.cfg.Topology.GroupsOfKind(topology.KindPublisher, region)) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The operator sits with the global epoch service, not in the cut region.
	return admin.SetRegionExcluded(ctx, cp.c.Dialer(global[0].Region), cp.cfg.Topology, region, excluded)
}

// probe commits one write in every data region, retrying for up to
// recoveryBound.
func (cp *campaign) probe(dbs []*client.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), recoveryBound)
	defer cancel()
	for i, db := range dbs {
		key := cp.key(i, "nemesis-probe")
		if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, key, []byte("x")) }); err != nil {
			return fmt.Errorf("%s: %w", cp.regions[i], err)
		}
	}
	return nil
}

// split splits the range holding key through a client; false when the
// split was refused or did not happen (an anomaly is recorded if it failed
// in a way it never should).
func (cp *campaign) split(ctx context.Context, db *client.DB, key []byte) (left client.RangeInfo, ok bool) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	left, _, err := db.AdminSplitRanges(sctx, key)
	switch {
	case errors.Is(err, client.ErrSplitKey):
		return left, false // already a boundary: no fault this time
	case client.IsRetryable(err) || errors.Is(err, client.ErrCommitUnknown) || ctx.Err() != nil:
		return left, false // the range was busy, or the campaign is ending
	case err != nil:
		cp.anomaly("splitting at %q: %v", key, err)
		return left, false
	}
	return left, true
}

// transferLease hands the lease of the range holding key to the first
// node, in order, that is another replica of it; false if none took it
// (an anomaly is recorded if a transfer failed in a way it never should).
func (cp *campaign) transferLease(ctx context.Context, db *client.DB, key []byte, order []int, nodes []uint64) bool {
	for _, i := range order {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := db.AdminTransferLease(tctx, key, nodes[i])
		cancel()
		switch {
		case err == nil:
			return true
		case errors.Is(err, client.ErrLeaseTarget):
			continue // not a replica, or the holder: try the next node
		case client.IsRetryable(err) || errors.Is(err, client.ErrCommitUnknown) || errors.Is(err, client.ErrUnavailable) || ctx.Err() != nil:
			return false // the range was busy, or the campaign is ending
		default:
			cp.anomaly("transferring the lease of the range at %q to node %d: %v", key, nodes[i], err)
			return false
		}
	}
	return false
}

// splitKey picks a key to split at among the workloads' keys of a random data
// region, so that their transactions span the new boundary.
func (cp *campaign) splitKey(r *rand.Rand) []byte {
	names := []string{
		fmt.Sprintf("nemesis-acct-%02d", r.IntN(16)),
		fmt.Sprintf("nemesis-g%d", r.IntN(4)),
		fmt.Sprintf("nemesis-g%d-k%d", r.IntN(4), r.IntN(6)),
		fmt.Sprintf("nemesis-list-%d", r.IntN(8)),
		fmt.Sprintf("nemesis-reg-%d", r.IntN(8)),
	}
	return cp.key(r.IntN(len(cp.keys)), names[r.IntN(len(names))])
}

// stallCommit runs one two-phase commit across two regions whose
// coordinator stalls after every participant prepared, heartbeats stopped,
// for stallFor: the participants abort it as an orphan and the txn-state
// leader forgets their abort record before the coordinator asks to commit
// (DESIGN.md §14). The store must refuse that commit (the forget watermark)
// unless it is the first decision; either way its writes are all there or
// all absent, as its outcome says.
func (cp *campaign) stallCommit(ctx context.Context) {
	if len(cp.regions) < 2 {
		return
	}
	db, err := cp.c.Client(cp.regions[0])
	if err != nil {
		cp.anomaly("a client for the stalled commit: %v", err)
		return
	}
	defer db.Close()
	db.SetStallHook(func([]byte, []uint64) time.Duration { return stallFor })
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stallFor+4*opTimeout)
	defer cancel()
	n := cp.now()
	keys := [][]byte{cp.key(0, fmt.Sprintf("nemesis-stall-%d", n)), cp.key(1, fmt.Sprintf("nemesis-stall-%d", n))}
	tx := db.Begin()
	for _, k := range keys {
		if err := tx.Put(cctx, k, []byte("stalled")); err != nil {
			_ = tx.Abort(cctx)
			cp.countOutcome("stalled commit", err)
			return
		}
	}
	_, err = tx.Commit(cctx)
	o := cp.countOutcome("stalled commit", err)
	var present []bool
	if _, rerr := db.View(cctx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
		present = present[:0]
		for _, k := range keys {
			_, ok, err := s.Get(ctx, k)
			if err != nil {
				return err
			}
			present = append(present, ok)
		}
		return nil
	}); rerr != nil {
		cp.countOutcome("stalled commit read", rerr)
		return
	}
	switch {
	case present[0] != present[1]:
		cp.anomaly("a stalled commit (%v) applied at one participant only: %v", err, present)
	case err == nil && !present[0]:
		cp.anomaly("a stalled commit was acknowledged but its writes are missing")
	case o == failed && present[0]:
		cp.anomaly("a stalled commit failed (%v) but its writes are there", err)
	}
}
