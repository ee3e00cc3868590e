package epoch

import (
	"sync/atomic"
	"time"
)

// PaceHold is how long one read that asks for the full pace keeps a local
// epoch advancing every interval: 1 s, the paper's lease length of 100
// epochs at the default 10 ms interval.
const PaceHold = time.Second

// Pace decides when a local epoch's leader advances (DESIGN.md §2; issue 17:
// an idle region should cost little). While the region is active — a reader
// asked for the full pace (Reader.Read, not ReadBackground) within PaceHold —
// the leader advances every interval, the paper's pace (§2.2). Otherwise it
// advances every idle interval: nothing then waits for the epoch to move,
// since commits only read it, and a leaseholder keeping its lease reads in
// the background. Whatever needs the epoch to move asks by reading it: a
// regional snapshot waiting for an epoch, a replica waiting out a dead
// leaseholder's lease or for a transferred lease to start, a commit. The
// pace changes how fast epochs pass, never their order, so no invariant of
// DESIGN.md §3 depends on it. Every replica of the group records the reads
// it serves, so a new leader starts from what its replica saw.
type Pace struct {
	interval, idle time.Duration
	wanted         atomic.Int64 // unix ns of the last read that asked for the full pace; 0: none
}

// NewPace returns the pace of a local epoch advanced every interval while
// active and every idle otherwise; idle ≤ interval keeps the full pace always.
func NewPace(interval, idle time.Duration) *Pace {
	return &Pace{interval: interval, idle: idle}
}

// Interval returns the full pace's period: the advance loop's tick.
func (p *Pace) Interval() time.Duration { return p.interval }

// Want records, at now, a read that asks for the full pace.
func (p *Pace) Want(now time.Time) { p.wanted.Store(now.UnixNano()) }

// Due reports whether a leader whose last advance began at last should
// advance at now: always while active, else once idle has passed since last.
func (p *Pace) Due(now, last time.Time) bool {
	if p.idle <= p.interval || now.Sub(last) >= p.idle {
		return true
	}
	w := p.wanted.Load()
	return w != 0 && now.UnixNano()-w < int64(PaceHold)
}
