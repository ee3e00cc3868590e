package ycsb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/topology"
)

// KeySpace names records. Key number n becomes prefix + "user" + the decimal
// FNV-64 hash of n (YCSB's hashed key names), the prefix picked by the hash
// among Prefixes, so records spread over several ranges (of one region, when
// the prefixes are chosen so). A scan stays within its start key's prefix.
type KeySpace struct {
	Prefixes [][]byte
}

// Key returns record n's key.
func (k KeySpace) Key(n uint64) []byte {
	h := fnv64(n)
	p := k.Prefixes[h%uint64(len(k.Prefixes))]
	return strconv.AppendUint(append(append([]byte{}, p...), "user"...), h, 10)
}

// scanEnd returns the end of the scan starting at record n's key.
func (k KeySpace) scanEnd(n uint64) []byte {
	p := k.Prefixes[fnv64(n)%uint64(len(k.Prefixes))]
	return append(append([]byte{}, p...), "user~"...)
}

// Config is one YCSB run.
type Config struct {
	Workload Workload
	Keys     KeySpace
	// Clients is the number of concurrent client threads.
	Clients int
	// Duration bounds the run when Workload.OperationCount is 0.
	Duration time.Duration
	// Seed makes the operation sequence repeatable.
	Seed uint64
	// Observe, if set, is called after each completed operation with its
	// latency (from every client goroutine: it must be safe for that).
	Observe func(op Op, d time.Duration)
}

// Result is one run's figures.
type Result struct {
	Workload Workload
	Clients  int
	Elapsed  time.Duration
	// Latency of each operation kind's transactions, retries included.
	Latency [numOps]*latency.Histogram
	// Failed transactions of each kind (after Update's retries, or a timeout).
	Failed [numOps]int64
	// Retries counts attempts run again after a conflict.
	Retries int64
}

// Ops returns the number of completed operations.
func (r *Result) Ops() int64 {
	var n int64
	for _, h := range r.Latency {
		n += h.Count()
	}
	return n
}

// Throughput returns completed operations per second.
func (r *Result) Throughput() float64 { return float64(r.Ops()) / r.Elapsed.Seconds() }

// Merge adds o, another run of the same workload and clients, to r: as
// one run that lasted both runs' time, its latencies those of both (a run
// split into slices that alternate with another system's: bench ycsb
// --pairs).
func (r *Result) Merge(o *Result) {
	r.Elapsed += o.Elapsed
	for i := range r.Latency {
		r.Latency[i].Merge(o.Latency[i])
		r.Failed[i] += o.Failed[i]
	}
	r.Retries += o.Retries
}

// record returns a record value: FieldCount fields of FieldLength bytes.
func (w Workload) record(r *rand.Rand) []byte {
	v := make([]byte, w.FieldCount*w.FieldLength)
	for i := range v {
		v[i] = 'a' + byte(r.IntN(26))
	}
	return v
}

// Load inserts the workload's RecordCount records from 4 parallel loaders,
// 100 per transaction.
func Load(ctx context.Context, store Store, w Workload, keys KeySpace, seed uint64) error {
	const batch, loaders = 100, 4
	var next atomic.Int64
	errs := make(chan error, loaders)
	for l := 0; l < loaders; l++ {
		go func(l int) {
			r := rand.New(rand.NewPCG(seed, uint64(1000+l)))
			for {
				lo := int(next.Add(batch)) - batch
				if lo >= w.RecordCount {
					errs <- nil
					return
				}
				var ks, vs [][]byte
				for i := lo; i < min(lo+batch, w.RecordCount); i++ {
					ks, vs = append(ks, keys.Key(uint64(i))), append(vs, w.record(r))
				}
				if err := store.Load(ctx, ks, vs); err != nil {
					errs <- fmt.Errorf("ycsb load: %w", err)
					return
				}
			}
		}(l)
	}
	var first error
	for range loaders {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// opTimeout bounds one operation's transaction, retries included.
const opTimeout = 10 * time.Second

// Run runs the workload on records already loaded, from cfg.Clients
// goroutines, until OperationCount operations completed or failed (or, if it
// is 0, for cfg.Duration), or ctx ends.
func Run(ctx context.Context, store Store, cfg Config) (*Result, error) {
	w := cfg.Workload
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clients <= 0 {
		return nil, errors.New("ycsb: at least one client")
	}
	res := &Result{Workload: w, Clients: cfg.Clients}
	for i := range res.Latency {
		res.Latency[i] = latency.New()
	}
	if w.OperationCount == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	var remaining atomic.Int64
	remaining.Store(int64(w.OperationCount))
	var inserts counter
	inserts.next.Store(uint64(w.RecordCount))
	retriesBefore := store.Retries()
	var failed [numOps]atomic.Int64
	began := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < cfg.Clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(cfg.Seed, uint64(c)))
			var chooser Chooser
			switch w.Distribution {
			case Uniform:
				chooser = uniform{}
			case Zipfian:
				chooser = newScrambledZipfian()
			case Latest:
				chooser = &latest{z: newZipfian(uint64(w.RecordCount))}
			}
			for ctx.Err() == nil {
				if w.OperationCount > 0 && remaining.Add(-1) < 0 {
					return
				}
				op := w.pick(r.Float64())
				// Keys inserted by now, less those possibly still in flight.
				visible := max(inserts.next.Load()-uint64(cfg.Clients), uint64(w.RecordCount))
				n := chooser.Next(r, visible)
				var value []byte
				switch op {
				case OpUpdate, OpReadModifyWrite:
					value = w.record(r)
				case OpInsert:
					n, value = inserts.take(), w.record(r)
				}
				scanLen := 0
				if op == OpScan {
					scanLen = 1 + r.IntN(w.MaxScanLength)
				}
				start := time.Now()
				octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
				key := cfg.Keys.Key(n)
				var err error
				switch op {
				case OpRead:
					err = store.Read(octx, key)
				case OpUpdate, OpInsert:
					err = store.Write(octx, key, value)
				case OpScan:
					err = store.Scan(octx, key, cfg.Keys.scanEnd(n), scanLen)
				default:
					err = store.ReadModifyWrite(octx, key, value)
				}
				cancel()
				if err != nil {
					failed[op].Add(1)
					continue
				}
				d := time.Since(start)
				res.Latency[op].Record(d)
				if cfg.Observe != nil {
					cfg.Observe(op, d)
				}
			}
		}(c)
	}
	wg.Wait()
	res.Elapsed = time.Since(began)
	res.Retries = store.Retries() - retriesBefore
	for i := range failed {
		res.Failed[i] = failed[i].Load()
	}
	return res, nil
}

// opReport is one operation kind's figures, in ms, for JSON.
type opReport struct {
	Op     string  `json:"op"`
	Count  int64   `json:"count"`
	Failed int64   `json:"failed"`
	P50    float64 `json:"p50_ms"`
	P95    float64 `json:"p95_ms"`
	P99    float64 `json:"p99_ms"`
	Mean   float64 `json:"mean_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *Result) ops() []opReport {
	var out []opReport
	for i, h := range r.Latency {
		if h.Count() == 0 && r.Failed[i] == 0 {
			continue
		}
		out = append(out, opReport{Op: Op(i).String(), Count: h.Count(), Failed: r.Failed[i],
			P50: ms(h.Quantile(50)), P95: ms(h.Quantile(95)), P99: ms(h.Quantile(99)), Mean: ms(h.Mean())})
	}
	return out
}

// JSON renders the result for machines.
func (r *Result) JSON() ([]byte, error) {
	return json.MarshalIndent(struct {
		Workload   Workload   `json:"workload"`
		Clients    int        `json:"clients"`
		ElapsedSec float64    `json:"elapsed_s"`
		OpsPerSec  float64    `json:"ops_per_s"`
		Retries    int64      `json:"retries"`
		Ops        []opReport `json:"operations"`
	}{r.Workload, r.Clients, r.Elapsed.Seconds(), r.Throughput(), r.Retries, r.ops()}, "", "  ")
}

// Markdown renders the result as a table for people.
func (r *Result) Markdown(title string) string {
	var b strings.Builder
	w := r.Workload
	fmt.Fprintf(&b, "## %s\n\nworkload %s: %d records × %d fields × %d B, %s distribution, %d clients, %v, %.0f ops/s, %d retried attempts\n\n",
		title, w.Name, w.RecordCount, w.FieldCount, w.FieldLength, w.Distribution, r.Clients, r.Elapsed.Round(time.Millisecond), r.Throughput(), r.Retries)
	b.WriteString("| operation | count | failed | P50 ms | P95 ms | P99 ms | mean ms |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, o := range r.ops() {
		fmt.Fprintf(&b, "| %s | %d | %d | %.3f | %.3f | %.3f | %.3f |\n", o.Op, o.Count, o.Failed, o.P50, o.P95, o.P99, o.Mean)
	}
	return b.String()
}

// RegionKeys returns a key space spreading records over every range homed in
// region, so that all operations of a client there are single-region.
func RegionKeys(top *topology.Topology, region string) (KeySpace, error) {
	var k KeySpace
	for _, g := range top.Ranges() {
		if g.Region != region {
			continue
		}
		p := append([]byte{}, g.Start...)
		if len(p) == 0 {
			p = []byte("0")
		}
		if !g.Contains(append(append([]byte{}, p...), "user"...)) || !g.Contains(append(append([]byte{}, p...), "user~"...)) {
			return k, fmt.Errorf("ycsb: cannot place keys in range %d [%q, %q)", g.ID, g.Start, g.End)
		}
		k.Prefixes = append(k.Prefixes, p)
	}
	if len(k.Prefixes) == 0 {
		return k, fmt.Errorf("ycsb: region %q homes no range", region)
	}
	return k, nil
}

// SideBySide renders two results of one workload as one Markdown table: each
// operation's P50 and P99 on both, and b's P50 over a's.
func SideBySide(nameA string, a *Result, nameB string, b *Result) string {
	var s strings.Builder
	fmt.Fprintf(&s, "| operation | %s P50 ms | %s P99 ms | %s P50 ms | %s P99 ms | %s/%s P50 |\n|---|---:|---:|---:|---:|---:|\n",
		nameA, nameA, nameB, nameB, nameB, nameA)
	for op := Op(0); op < numOps; op++ {
		ha, hb := a.Latency[op], b.Latency[op]
		if ha.Count() == 0 && hb.Count() == 0 {
			continue
		}
		r := 0.0
		if p := ha.Quantile(50); p > 0 {
			r = float64(hb.Quantile(50)) / float64(p)
		}
		fmt.Fprintf(&s, "| %s | %.3f | %.3f | %.3f | %.3f | %.2f× |\n", op, ms(ha.Quantile(50)), ms(ha.Quantile(99)),
			ms(hb.Quantile(50)), ms(hb.Quantile(99)), r)
	}
	fmt.Fprintf(&s, "| throughput (ops/s) | %.0f | | %.0f | | %.2f× |\n", a.Throughput(), b.Throughput(), b.Throughput()/a.Throughput())
	return s.String()
}
