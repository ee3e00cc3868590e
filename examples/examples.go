// Package examples embeds the shipped topology files so the binary can run its
// demo and benchmarks without a checkout.
package examples

import _ "embed"

// OneRegion is examples/one-region.yaml: one region, three nodes, a local epoch group.
//
//go:embed one-region.yaml
var OneRegion []byte

// ThreeRegions is examples/three-regions.yaml: us-east1 and us-west1 hold the
// data, us-central1 runs the global epoch service (the paper's §6.2 layout).
//
//go:embed three-regions.yaml
var ThreeRegions []byte

// OneRange is examples/one-range.yaml: one region, three nodes and a single
// range, which `terroir bench split` watches split by load.
//
//go:embed one-range.yaml
var OneRange []byte
