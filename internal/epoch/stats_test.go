package epoch

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestStatsCountAReadsWaitForTheRoundInFlight: a read that arrives while a
// round is in flight waits for it to end before its own round begins, and
// Stats shows that wait apart from the rounds' own time (issue 17: under
// load the wait is about half a round of a commit's epoch read). Replicas
// that take 100 ms to answer make each round last at least that; the
// second read joins 20 ms into the first round, so it waits at least 50
// ms, and the two rounds take at least 180 ms between them. It fails if
// the wait is not counted ("waited 0s").
func TestStatsCountAReadsWaitForTheRoundInFlight(t *testing.T) {
	const delay = 100 * time.Millisecond
	f := newFakeReplicas(map[uint64]uint64{1: 50, 2: 50, 3: 50})
	for id := range uint64(3) {
		f.delay[id+1] = delay
	}
	r := fakeReader(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	read := func() {
		defer wg.Done()
		if e, err := r.Read(ctx); err != nil || e != 50 {
			t.Errorf("read %d, %v; want 50", e, err)
		}
	}
	wg.Add(2)
	go read()
	for deadline := time.Now().Add(5 * time.Second); r.Stats().Rounds == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the first read's round did not start")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	go read()
	wg.Wait()
	st := r.Stats()
	if st.Rounds != 2 || st.Reads != 2 {
		t.Fatalf("%d reads in %d rounds; want 2 in 2 (the second arrived during the first round)", st.Reads, st.Rounds)
	}
	if st.Waited < delay/2 {
		t.Fatalf("the reads waited %v for their rounds to begin; want at least %v (the second waited out the first round)", st.Waited, delay/2)
	}
	if st.InRounds < 2*delay*9/10 {
		t.Fatalf("the rounds took %v; want at least %v (two rounds of replicas that answer in %v)", st.InRounds, 2*delay*9/10, delay)
	}
}
