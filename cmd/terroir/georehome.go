package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/latency"
)

// rehomePhase holds the write latencies of one phase of the rehoming
// measurement, by the writer's region.
type rehomePhase struct {
	name   string
	byFrom map[string]*latency.Histogram
	fails  map[string]*atomic.Int64
}

// benchRehome measures rehoming a range under load (DESIGN.md §13): while
// writers in both regions update keys of range [g, m) of home, it runs for
// d, rehomes the range to away, and runs for d again. It prints each
// region's write P50/P99 before, during and after the rehome, and how long
// the rehome took.
func benchRehome(ctx context.Context, dbs map[string]*client.DB, home, away string, writers int, d time.Duration) error {
	const records = 100
	key := func(i uint64) []byte { return []byte(fmt.Sprintf("h-geo-%03d", i)) }
	for i := range uint64(records) {
		if err := dbs[home].Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, key(i), []byte("v")) }); err != nil {
			return fmt.Errorf("loading the rehomed range: %w", err)
		}
	}
	newPhase := func(name string) *rehomePhase {
		p := &rehomePhase{name: name, byFrom: map[string]*latency.Histogram{}, fails: map[string]*atomic.Int64{}}
		for region := range dbs {
			p.byFrom[region], p.fails[region] = latency.New(), &atomic.Int64{}
		}
		return p
	}
	var cur atomic.Pointer[rehomePhase]
	var mu sync.Mutex // guards the histograms
	phases := []*rehomePhase{newPhase("before"), newPhase("during"), newPhase("after")}
	cur.Store(phases[0])
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for region, db := range dbs {
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					p := cur.Load()
					wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					start := time.Now()
					err := db.Update(wctx, func(ctx context.Context, tx *client.Txn) error {
						return tx.Put(ctx, key(rand.Uint64N(records)), []byte(start.String()))
					})
					cancel()
					if err != nil {
						p.fails[region].Add(1)
						continue
					}
					mu.Lock()
					p.byFrom[region].Since(start)
					mu.Unlock()
				}
			}()
		}
	}
	time.Sleep(d)
	cur.Store(phases[1])
	began := time.Now()
	r, barrier, err := dbs[home].AdminRehome(ctx, key(0), away)
	took := time.Since(began)
	cur.Store(phases[2])
	if err == nil {
		time.Sleep(d)
	}
	close(stop)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("rehoming: %w", err)
	}
	fmt.Printf("\nrehoming range %d [%q, %q) from %s to %s under load: %v (barrier at global epoch %d; voters now %v)\n",
		r.ID, r.Start, r.End, home, away, took.Round(time.Millisecond), barrier, r.Replicas)
	printHeader()
	for _, p := range phases {
		span := d
		if p.name == "during" {
			span = took
		}
		for _, region := range []string{home, away} {
			printRow(fmt.Sprintf("write from %s, %s the rehome", region, p.name), p.byFrom[region], span, int(p.fails[region].Load()))
		}
	}
	return nil
}
