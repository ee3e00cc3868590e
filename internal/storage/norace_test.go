//go:build !race

package storage

// raceEnabled: the tests run under the race detector, whose build turns on
// Pebble's invariant checks.
const raceEnabled = false
