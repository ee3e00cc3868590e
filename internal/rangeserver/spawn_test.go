package rangeserver

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// A request's goroutine may spawn background work (settleOnePhase) while
// the replica closes: the work either runs and Close waits for it, or does
// not run at all. Found by the nemesis's disk stall: an unguarded Add after
// Close's Wait began panicked ("WaitGroup is reused"); -race reports it too.
func TestSpawnDuringCloseRunsOrNot(t *testing.T) {
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		r := &Replica{ctx: ctx, cancel: cancel}
		var ran, finished atomic.Int32
		start := make(chan struct{})
		var requests sync.WaitGroup
		for range 4 {
			requests.Add(1)
			go func() {
				defer requests.Done()
				<-start
				r.spawn(func() {
					ran.Add(1)
					<-r.ctx.Done()
					finished.Add(1)
				})
			}()
		}
		close(start)
		r.Close()
		if ran, finished := ran.Load(), finished.Load(); ran != finished {
			t.Fatalf("Close returned with %d of %d spawned goroutines running", ran-finished, ran)
		}
		requests.Wait()
		if ran, finished := ran.Load(), finished.Load(); ran != finished {
			t.Fatalf("%d goroutines spawned after Close returned", ran-finished)
		}
	}
}
