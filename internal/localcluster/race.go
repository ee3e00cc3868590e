//go:build race

package localcluster

// raceEnabled reports a build with the race detector (go test -race).
const raceEnabled = true
