package console

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// chart is one latency chart: the histogram series of metric whose labels
// include match, summed.
type chart struct {
	name   string
	metric string
	match  map[string]string
}

// charts are what the console plots, from the node's own histograms
// (node.metrics).
var charts = []chart{
	{"one-phase commits", "terroir_transaction_commit_seconds", map[string]string{"kind": "one_phase"}},
	{"two-phase commit records", "terroir_transaction_commit_seconds", map[string]string{"kind": "two_phase"}},
	{"snapshot reads", "terroir_rpc_server_seconds", map[string]string{"method": "Range/SnapshotRead", "code": "OK"}},
	{"transactional reads", "terroir_rpc_server_seconds", map[string]string{"method": "Range/Get", "code": "OK"}},
}

const (
	sampleEvery  = time.Second
	samplePoints = 300 // five minutes
)

// Series is one chart's points: [unix ms, P50 ms, P99 ms, requests/s], one
// per second that saw requests.
type Series struct {
	Name   string       `json:"name"`
	Points [][4]float64 `json:"points"`
}

// buckets is a histogram's cumulative counts at its upper bounds (s).
type buckets struct {
	bounds []float64
	counts []uint64
}

// sampler turns the node's cumulative histograms into per-second P50, P99
// and rate, keeping the last samplePoints of each chart.
type sampler struct {
	g prometheus.Gatherer

	mu     sync.Mutex
	prev   map[string]buckets
	prevAt time.Time
	points map[string][][4]float64

	once    sync.Once
	stop    chan struct{}
	done    chan struct{}
	started bool // under mu
}

func newSampler(g prometheus.Gatherer) *sampler {
	return &sampler{g: g, prev: map[string]buckets{}, points: map[string][][4]float64{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// start begins sampling, once; after close it does nothing.
func (s *sampler) start() {
	s.once.Do(s.run)
}

func (s *sampler) run() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stop:
		return // closed before it started
	default:
	}
	s.started = true
	go func() {
		defer close(s.done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case now := <-t.C:
				s.sample(now)
			}
		}
	}()
}

// close stops sampling and waits for the sampler to end.
func (s *sampler) close() {
	s.mu.Lock()
	select {
	case <-s.stop:
		s.mu.Unlock()
		return
	default:
	}
	close(s.stop)
	started := s.started
	s.mu.Unlock()
	if started {
		<-s.done
	}
}

// sample gathers the histograms once and adds a point per chart that saw
// requests since the last sample.
func (s *sampler) sample(now time.Time) {
	mfs, err := s.g.Gather()
	if err != nil {
		return
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dt := now.Sub(s.prevAt).Seconds()
	for _, c := range charts {
		cur := sum(byName[c.metric], c.match)
		prev, had := s.prev[c.name]
		s.prev[c.name] = cur
		if !had || len(prev.counts) != len(cur.counts) || len(cur.counts) == 0 {
			continue
		}
		delta := buckets{bounds: cur.bounds, counts: make([]uint64, len(cur.counts))}
		for i := range cur.counts {
			delta.counts[i] = cur.counts[i] - min(prev.counts[i], cur.counts[i])
		}
		total := delta.counts[len(delta.counts)-1]
		if total == 0 {
			continue
		}
		p := [4]float64{float64(now.UnixMilli()), quantile(delta, 0.5) * 1e3, quantile(delta, 0.99) * 1e3, float64(total) / dt}
		pts := append(s.points[c.name], p)
		if len(pts) > samplePoints {
			pts = pts[len(pts)-samplePoints:]
		}
		s.points[c.name] = pts
	}
	s.prevAt = now
}

// snapshot returns every chart's points.
func (s *sampler) snapshot() []Series {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Series, 0, len(charts))
	for _, c := range charts {
		out = append(out, Series{Name: c.name, Points: append([][4]float64{}, s.points[c.name]...)})
	}
	return out
}

// sum adds up the histograms of mf whose labels include match; the last
// count is the total (the +Inf bucket).
func sum(mf *dto.MetricFamily, match map[string]string) buckets {
	var b buckets
	if mf == nil {
		return b
	}
	for _, m := range mf.GetMetric() {
		if !matches(m, match) || m.GetHistogram() == nil {
			continue
		}
		h := m.GetHistogram()
		if b.bounds == nil {
			for _, bk := range h.GetBucket() {
				b.bounds = append(b.bounds, bk.GetUpperBound())
			}
			b.bounds = append(b.bounds, math.Inf(1))
			b.counts = make([]uint64, len(b.bounds))
		}
		if len(h.GetBucket())+1 != len(b.counts) {
			continue
		}
		for i, bk := range h.GetBucket() {
			b.counts[i] += bk.GetCumulativeCount()
		}
		b.counts[len(b.counts)-1] += h.GetSampleCount()
	}
	return b
}

func matches(m *dto.Metric, match map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := match[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(match)
}

// quantile estimates the q quantile (s) of cumulative bucket counts,
// interpolating linearly inside the bucket it falls in, as Prometheus's
// histogram_quantile does; in the +Inf bucket it answers the last finite
// bound.
func quantile(b buckets, q float64) float64 {
	total := b.counts[len(b.counts)-1]
	rank := q * float64(total)
	for i, c := range b.counts {
		if float64(c) < rank {
			continue
		}
		if math.IsInf(b.bounds[i], 1) {
			if i == 0 {
				return 0
			}
			return b.bounds[i-1]
		}
		lo, below := 0.0, uint64(0)
		if i > 0 {
			lo, below = b.bounds[i-1], b.counts[i-1]
		}
		in := c - below
		if in == 0 {
			return b.bounds[i]
		}
		return lo + (b.bounds[i]-lo)*(rank-float64(below))/float64(in)
	}
	return b.bounds[len(b.bounds)-2]
}
