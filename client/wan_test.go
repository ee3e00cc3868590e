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
// 300 ms moves their median latency by less than 10%. The two settings
// alternate in short rounds so that the machine's drift falls on both alike.
func TestRegionalLatencyIgnoresTheWAN(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 120*time.Second)
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	net := c.Dialer("us-east1").Network()
	setRTT := func(rtt time.Duration) {
		for _, p := range [][2]string{{"us-east1", "us-west1"}, {"us-east1", "us-central1"}, {"us-west1", "us-central1"}} {
			net.SetRTT(p[0], p[1], rtt)
		}
	}
	hist := map[time.Duration]*latency.Histogram{30 * time.Millisecond: latency.New(), 300 * time.Millisecond: latency.New()}
	n := 0
	for round := 0; round < 6; round++ {
		rtt := 30 * time.Millisecond
		if round%2 == 1 {
			rtt = 300 * time.Millisecond
		}
		setRTT(rtt)
		time.Sleep(700 * time.Millisecond) // let the global epoch settle to the new pace
		for i := 0; i < 50; i++ {
			n++
			key := []byte(fmt.Sprintf("c-%d", n%20))
			began := time.Now()
			err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
				if _, _, err := tx.Get(ctx, key); err != nil {
					return err
				}
				return tx.Put(ctx, key, []byte{byte(n)})
			})
			if err != nil {
				t.Fatal(err)
			}
			hist[rtt].Since(began)
		}
	}
	fast, slow := hist[30*time.Millisecond].Quantile(0.5), hist[300*time.Millisecond].Quantile(0.5)
	t.Logf("single-region read-write P50: %v at 30 ms cross-region RTT, %v at 300 ms", fast, slow)
	if float64(slow) > 1.1*float64(fast) {
		t.Fatalf("single-region P50 rose from %v to %v (more than 10%%) when the WAN slowed", fast, slow)
	}
}
