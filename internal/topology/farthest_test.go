package topology_test

import (
	"testing"

	"github.com/terroir-db/terroir/examples"
	"github.com/terroir-db/terroir/internal/topology"
)

// The round trip bench paper measures, and the interval's floor
// (FarthestPublisherRTT), is to the publisher farthest from the service:
// us-west1's from us-central1 (37 ms against us-east1's 31). From us-east1
// it is us-west1's too (63 ms against its own region's 0), and a topology
// without publishers has none.
func TestFarthestPublisherIsTheOneAtTheLargestRTT(t *testing.T) {
	top, err := topology.Parse(examples.ThreeRegions)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, want string }{{"us-central1", "us-west1"}, {"us-east1", "us-west1"}, {"us-west1", "us-east1"}} {
		far, ok := top.FarthestPublisher(tc.from)
		if !ok || far.Region != tc.want {
			t.Errorf("from %s: farthest publisher %+v (ok %v), want the one in %s", tc.from, far, ok, tc.want)
		}
	}
	if got := top.FarthestPublisherRTT(); got != top.RTT("us-central1", "us-west1") {
		t.Errorf("FarthestPublisherRTT %s, want us-central1 to us-west1's %s", got, top.RTT("us-central1", "us-west1"))
	}
	one, err := topology.Parse(examples.OneRegion)
	if err != nil {
		t.Fatal(err)
	}
	if far, ok := one.FarthestPublisher("us-east1"); ok {
		t.Errorf("one region without publishers: farthest publisher %+v, want none", far)
	}
}
