package tick

import (
	"slices"
	"testing"
	"time"
)

func TestUntilNextLandsOnTheNextWholeMultiple(t *testing.T) {
	d := 10 * time.Millisecond
	for _, c := range []struct {
		now  time.Time
		want time.Duration
	}{
		{time.Unix(100, 0), d}, // on an instant: the next one, a period away
		{time.Unix(100, int64(3*time.Millisecond)), 7 * time.Millisecond},
		{time.Unix(100, int64(9999*time.Microsecond)), time.Microsecond},
		{time.Unix(100, int64(10*time.Millisecond+1)), d - 1},
	} {
		got := untilNext(c.now, d)
		if got != c.want {
			t.Errorf("untilNext(%v, %v) = %v, want %v", c.now.UnixNano(), d, got, c.want)
		}
		if at := c.now.Add(got).UnixNano(); at%int64(d) != 0 {
			t.Errorf("from %v the tick lands at %v, not a multiple of %v", c.now.UnixNano(), at, d)
		}
	}
}

// Tickers created halfway between two aligned instants tick on the
// instants nonetheless: the wall-clock times of their ticks are whole
// multiples of the period, give or take the runtime's lateness in
// delivering them. A time.Ticker made at those moments would tick half a
// period off the instants, every time.
func TestTickersStartedOffPhaseTickOnTheInstants(t *testing.T) {
	const d = 40 * time.Millisecond
	halfway := func() { time.Sleep(untilNext(time.Now(), d) + d/2) }
	halfway()
	a := NewTicker(d)
	defer a.Stop()
	halfway()
	b := NewTicker(d)
	defer b.Stop()
	late := func(at time.Time) time.Duration { return time.Duration(at.UnixNano() % int64(d)) }
	for name, tk := range map[string]*Ticker{"first": a, "second": b} {
		var lates []time.Duration
		for range 5 {
			select {
			case at := <-tk.C:
				tk.Next()
				lates = append(lates, late(at))
			case <-time.After(time.Second):
				t.Fatalf("%s ticker: no tick within a second: Next did not re-arm it", name)
			}
		}
		slices.Sort(lates)
		// The median: one tick delivered late on a loaded machine does
		// not decide it.
		if m := lates[len(lates)/2]; m >= d/4 {
			t.Errorf("%s ticker: its ticks came a median %v after the aligned instants (period %v): %v", name, m, d, lates)
		} else {
			t.Logf("%s ticker: median %v after the aligned instants", name, m)
		}
	}
}

func TestStopDeliversNoMoreTicks(t *testing.T) {
	tk := NewTicker(5 * time.Millisecond)
	tk.Stop()
	select {
	case <-tk.C:
		t.Fatal("a stopped ticker ticked")
	case <-time.After(30 * time.Millisecond):
	}
}

// A ticker with a phase ticks that long after the aligned instants, so two
// loops of one period but different phases never tick together.
func TestPhaseShiftsTheTicks(t *testing.T) {
	const d = 40 * time.Millisecond
	for _, phase := range []time.Duration{d / 2, d + d/4, -d / 4} {
		tk := NewTickerPhase(d, phase)
		want := ((phase % d) + d) % d
		var offs []time.Duration
		for range 5 {
			select {
			case at := <-tk.C:
				tk.Next()
				offs = append(offs, time.Duration(at.UnixNano()%int64(d)))
			case <-time.After(time.Second):
				t.Fatalf("phase %v: no tick within a second", phase)
			}
		}
		tk.Stop()
		slices.Sort(offs)
		// The median lateness past the shifted instant (a loaded machine
		// delivers some ticks late, none early).
		if late := (offs[len(offs)/2] - want + d) % d; late >= d/4 {
			t.Errorf("phase %v: ticks came at %v into each period; want %v (median %v late)", phase, offs, want, late)
		}
	}
}
