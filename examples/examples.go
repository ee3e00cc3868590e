// Package examples embeds the shipped topology files so the binary can run its
// demo and benchmarks without a checkout.
package examples

import _ "embed"

// OneRegion is examples/one-region.yaml: one region, three nodes, a local epoch group.
//
//go:embed one-region.yaml
var OneRegion []byte
