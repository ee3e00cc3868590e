//go:build !race

package localcluster

// raceEnabled reports a build with the race detector (race.go).
const raceEnabled = false
