package rangeserver

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"sync"
	"time"
)

// loadWindow is the window over which a leader counts its requests.
const loadWindow = time.Second

// loadSamples is the size of the reservoir of request keys a hot range keeps
// to find a split key.
const loadSamples = 20

// loadTracker measures a range leader's request rate, per loadWindow, and,
// while the range is hot, finds a key that divides its requests evenly: as
// CockroachDB's load-based splitting does, it keeps a reservoir of sampled
// request keys, each counting the requests that fell to its left and to its
// right since it was sampled. A range that is not hot pays one counter
// increment per request.
type loadTracker struct {
	now func() time.Time
	hot float64 // requests per second at which sampling starts (0: never)

	mu          sync.Mutex
	windowStart time.Time
	count       int64   // requests in the current window
	rate        float64 // requests per second over the last complete window
	sampling    time.Time
	seen        int64 // requests offered to the reservoir since sampling began
	samples     []loadSample
	writes      map[string]int64   // write transactions committed in the current window, by coordinator region
	writeRates  map[string]float64 // per second over the last complete window
}

// loadSample is a sampled request key and the requests on either side of it.
type loadSample struct {
	key         []byte
	left, right int64
}

func newLoadTracker(now func() time.Time, hot float64) *loadTracker {
	return &loadTracker{now: now, hot: hot, windowStart: now()}
}

// roll closes the current window if it is over; callers hold mu.
func (lt *loadTracker) roll(now time.Time) {
	if d := now.Sub(lt.windowStart); d >= loadWindow {
		lt.rate = float64(lt.count) / d.Seconds()
		lt.writeRates = nil
		for region, n := range lt.writes {
			if lt.writeRates == nil {
				lt.writeRates = map[string]float64{}
			}
			lt.writeRates[region] = float64(n) / d.Seconds()
		}
		if d >= 2*loadWindow {
			lt.rate, lt.writeRates = 0, nil // a whole window went by without a request
		}
		lt.count, lt.windowStart = 0, now
		clear(lt.writes)
		hot := lt.hot > 0 && lt.rate >= lt.hot
		switch {
		case hot && lt.sampling.IsZero():
			lt.sampling, lt.seen, lt.samples = now, 0, nil
		case !hot:
			lt.sampling, lt.samples = time.Time{}, nil
		}
	}
}

// record counts one request whose first key is key.
func (lt *loadTracker) record(key []byte) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	now := lt.now()
	lt.roll(now)
	lt.count++
	if lt.sampling.IsZero() {
		return
	}
	for i := range lt.samples {
		switch c := bytes.Compare(key, lt.samples[i].key); {
		case c < 0:
			lt.samples[i].left++
		case c > 0:
			lt.samples[i].right++
		}
	}
	lt.seen++
	if len(lt.samples) < loadSamples {
		lt.samples = append(lt.samples, loadSample{key: append([]byte(nil), key...)})
	} else if i := rand.Int64N(lt.seen); i < loadSamples {
		lt.samples[i] = loadSample{key: append([]byte(nil), key...)}
	}
}

// recordWrite counts one write transaction committed here whose
// coordinator is in region ("" is not counted).
func (lt *loadTracker) recordWrite(region string) {
	if region == "" {
		return
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.roll(lt.now())
	if lt.writes == nil {
		lt.writes = map[string]int64{}
	}
	lt.writes[region]++
}

// WriteRates returns the write transactions per second committed here over
// the last complete window, by coordinator region (nil: none).
func (lt *loadTracker) WriteRates() map[string]float64 {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.roll(lt.now())
	return maps.Clone(lt.writeRates)
}

// reset forgets the samples (the range changed shape); the rate stays.
func (lt *loadTracker) reset() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.sampling, lt.samples = time.Time{}, nil
}

// QPS returns the requests per second over the last complete window.
func (lt *loadTracker) QPS() float64 {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.roll(lt.now())
	return lt.rate
}

// splitKey returns a key that divides the requests sampled while the range
// has been hot for at least minHot, as evenly as the samples allow and no
// worse than a quarter against three quarters; nil if there is none (the
// range is not hot, or a single key carries the load).
func (lt *loadTracker) splitKey(minHot time.Duration) []byte {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.roll(lt.now())
	if lt.sampling.IsZero() || lt.now().Sub(lt.sampling) < minHot {
		return nil
	}
	var best []byte
	bestImbalance := 0.5
	for _, s := range lt.samples {
		total := s.left + s.right
		if total < 100 {
			continue
		}
		imbalance := float64(s.left)/float64(total) - 0.5
		if imbalance < 0 {
			imbalance = -imbalance
		}
		if imbalance <= 0.25 && imbalance < bestImbalance {
			best, bestImbalance = s.key, imbalance
		}
	}
	return best
}
