package epoch

import (
	"slices"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
)

// Majority reads across configuration changes (DESIGN.md §12). A read
// returns e only when, in one configuration C, a majority of each of C's
// voter halves (one half, or two during a joint change) reported exactly e
// applied under C, and C is the newest configuration any reply showed.
// Replicas keep their side: a reply's epoch was applied under the
// configuration it names (read between two reads of the configuration),
// and a replica whose log holds a configuration change it has not applied
// does not answer.
//
// Why that keeps reads monotonic. Let read 1 return e under C1 (made at log
// index i1) from quorum Q1, and read 2, started after read 1 returned,
// return e2 under C2 (index i2) from Q2; let L be the log index where the
// epoch became e. Applied state only grows, and epochs grow along the log.
//   - i2 = i1: Q1 and Q2 are majorities of the same halves, so they share
//     a replica, whose epoch only grew: e2 ≥ e.
//   - i2 > i1: Q2's replicas applied index i2. If L < i2 they applied L,
//     so e2 ≥ e. L > i2 is impossible: Q1's replicas applied L, hence i2,
//     and would have named C2 or newer, not C1.
//   - i2 < i1: let C' (index i') be the configuration after C2; i' ≤ i1,
//     and C1 was applied, so committed, before read 2 began, and C' with
//     it. C' was committed by a quorum of C2 or, at a new leader that had
//     not applied C2 yet, of the configuration before C2; with joint
//     consensus either intersects every quorum of C2. So some replica of
//     Q2 held C' in its log when it answered: it had applied C' (and named
//     it, not C2) or it abstained. Either way it is not in Q2: impossible.
//
// A reply that names no voters comes from a node older than configuration
// indexes; it is counted under the bootstrap configuration (index 0), which
// is right for every group that never changed configuration.

// reply is one replica's answer in an attempt.
type reply struct {
	node  uint64
	epoch uint64
	conf  config
	err   error
}

// config is a group configuration as a reply names it.
type config struct {
	index  uint64
	halves [][]uint64 // the voters; during a joint change, the incoming then the outgoing voters
}

// members returns every voter of c, each once.
func (c config) members() []uint64 {
	var out []uint64
	for _, h := range c.halves {
		for _, id := range h {
			if !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	return out
}

// replyConfig is the configuration resp names, or boot for a reply that
// names none.
func replyConfig(resp *epochpb.ReadEpochResponse, boot []uint64) config {
	if len(resp.GetVoters()) == 0 {
		return config{halves: [][]uint64{boot}}
	}
	c := config{index: resp.GetConfIndex(), halves: [][]uint64{resp.GetVoters()}}
	if len(resp.GetVotersOutgoing()) > 0 {
		c.halves = append(c.halves, resp.GetVotersOutgoing())
	}
	return c
}

// tally collects one attempt's replies, at most one per node. A handful
// of replies at most: slices, no maps (it runs on every epoch read).
type tally struct {
	replies []reply // successful ones only
	newest  config  // the newest configuration a reply named
}

func newTally(known config) *tally {
	return &tally{replies: make([]reply, 0, 5), newest: known}
}

// add counts rep. It reports whether rep named a configuration newer than
// any before (whose members the attempt then asks too).
func (t *tally) add(rep reply) (newer bool) {
	if rep.err != nil {
		return false
	}
	t.replies = append(t.replies, rep)
	switch {
	case rep.conf.index > t.newest.index:
		t.newest = rep.conf
		return true
	case rep.conf.index == t.newest.index:
		t.newest = rep.conf // a reply names its halves exactly; what the reader knew may not
	}
	return false
}

// decide returns the epoch a majority of each half of the newest
// configuration reported under it, if there is one.
func (t *tally) decide() (uint64, bool) {
	for i, rep := range t.replies {
		if rep.conf.index == t.newest.index && !t.seen(i, rep.epoch) && t.agreed(rep.epoch) {
			return rep.epoch, true
		}
	}
	return 0, false
}

// reached reports whether a majority of every half of the newest
// configuration reported, under it, an epoch of at least e. Every read that
// starts later then returns at least e: the argument above holds with "a
// majority applied the entry that made the epoch e" in place of "reported
// exactly e", which is what it uses.
func (t *tally) reached(e uint64) bool {
	for _, half := range t.newest.halves {
		n := 0
		for _, rep := range t.replies {
			if rep.conf.index == t.newest.index && rep.epoch >= e && slices.Contains(half, rep.node) {
				n++
			}
		}
		if n < len(half)/2+1 {
			return false
		}
	}
	return len(t.newest.halves) > 0
}

// seen reports whether a reply before the i-th under the newest
// configuration reported e (and so was decided on already).
func (t *tally) seen(i int, e uint64) bool {
	for _, rep := range t.replies[:i] {
		if rep.conf.index == t.newest.index && rep.epoch == e {
			return true
		}
	}
	return false
}

// agreed reports whether a majority of every half of the newest
// configuration reported e under it.
func (t *tally) agreed(e uint64) bool {
	for _, half := range t.newest.halves {
		n := 0
		for _, rep := range t.replies {
			if rep.conf.index == t.newest.index && rep.epoch == e && slices.Contains(half, rep.node) {
				n++
			}
		}
		if n < len(half)/2+1 {
			return false
		}
	}
	return len(t.newest.halves) > 0
}
