package client_test

import (
	"testing"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/topology"
)

// threeRegions is a running examples/three-regions.yaml with a client and a
// publisher reader in each data region.
type threeRegions struct {
	c                *localcluster.Cluster
	top              *topology.Topology
	east, west       *client.DB
	pubEast, pubWest *epoch.Reader
}

// startThreeRegions starts examples/three-regions.yaml, changed first by
// tune if not nil, and stops it when the test ends.
func startThreeRegions(t *testing.T, tune func(top *topology.Topology)) *threeRegions {
	t.Helper()
	top, err := topology.Load("../examples/three-regions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(top)
	}
	c, err := localcluster.Start(top, localcluster.Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	r := &threeRegions{c: c, top: top}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	r.east, err = c.Client("us-east1")
	must(err)
	r.west, err = c.Client("us-west1")
	must(err)
	r.pubEast, err = c.Reader(topology.KindPublisher, "us-east1", "us-east1")
	must(err)
	r.pubWest, err = c.Reader(topology.KindPublisher, "us-west1", "us-west1")
	must(err)
	return r
}
