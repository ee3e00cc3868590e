package epoch

import (
	"sync/atomic"
	"time"
)

// PaceHold is how long one read that asks for an epoch keeps that epoch at
// its full pace: 1 s, the paper's lease length of 100 local epochs at the
// default 10 ms interval.
const PaceHold = time.Second

// Demand records when a reader last asked for an epoch to move (issue 17:
// an idle cluster should cost little). Every read does (Reader.Read) but a
// housekeeping one (Reader.ReadBackground, Reader.AtLeast): a leaseholder
// keeping its lease, a range leader closing an epoch or sampling one for GC,
// a publisher certifying an update, and a commit (ReadAll), which reads the
// epochs current once its locks are held and waits for none to pass.
// Whatever waits for an epoch to pass asks by reading it — a snapshot, a
// changefeed waiting for epochs to close, a writer waiting out a quiet
// epoch, a replica waiting out a dead leaseholder's lease or for a
// transferred one to start, a new leader waiting for the global epoch to
// advance (DESIGN.md §3.5). Every replica records the reads it serves, so a
// new leader starts from what its replica saw. The zero value has seen none.
type Demand struct {
	wanted atomic.Int64 // when the last read that asked came, in ns since demandOrigin; 0: none
}

// demandOrigin is the monotonic origin of Demand's times: a step of the
// wall clock neither stretches nor cuts a hold.
var demandOrigin = time.Now()

// Want records, at now, a read that asks for the epoch.
func (d *Demand) Want(now time.Time) { d.wanted.Store(max(int64(now.Sub(demandOrigin)), 1)) }

// Active reports whether a read asked within PaceHold before now.
func (d *Demand) Active(now time.Time) bool {
	w := d.wanted.Load()
	return w != 0 && int64(now.Sub(demandOrigin))-w < int64(PaceHold)
}

// Pace decides when a local epoch's leader advances (DESIGN.md §2): every
// interval while its Demand is active, the paper's pace (§2.2), and every
// idle interval otherwise. The pace changes how fast epochs pass, never
// their order, so no invariant of DESIGN.md §3 depends on it: leases are
// intervals of epochs, and a replica that waits for one to end asks.
type Pace struct {
	Demand
	interval, idle time.Duration
}

// NewPace returns the pace of a local epoch advanced every interval while
// active and every idle otherwise; idle ≤ interval keeps the full pace always.
func NewPace(interval, idle time.Duration) *Pace {
	return &Pace{interval: interval, idle: idle}
}

// Interval returns the full pace's period: the advance loop's tick.
func (p *Pace) Interval() time.Duration { return p.interval }

// Due reports whether a leader whose last advance began at last should
// advance at now: always while active, else once idle has passed since last.
func (p *Pace) Due(now, last time.Time) bool {
	return p.idle <= p.interval || now.Sub(last) >= p.idle || p.Active(now)
}
