package rangeserver

import (
	"testing"
	"time"
)

// A transaction ID sent whole is claimed once, and stays claimed for at
// least oneShotMemory.
func TestOneShotsClaimAnIDOnce(t *testing.T) {
	var o oneShots
	at := time.Unix(1000, 0)
	if !o.claim([]byte("a"), at) {
		t.Fatal("a new ID was refused")
	}
	for _, after := range []time.Duration{0, time.Second, oneShotMemory, 2*oneShotMemory - time.Millisecond} {
		if o.claim([]byte("a"), at.Add(after)) {
			t.Fatalf("%v later, the same ID was claimed again", after)
		}
	}
	if !o.claim([]byte("b"), at.Add(oneShotMemory)) {
		t.Fatal("another ID was refused")
	}
	// Two rotations later the first generation is gone.
	if !o.claim([]byte("a"), at.Add(3*oneShotMemory)) {
		t.Fatal("an ID was remembered past 2·oneShotMemory")
	}
}
