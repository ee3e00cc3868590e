package experiment

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestEachTurnAlternatesTheModes: every mode runs once per turn, in the
// given order, before any runs its next turn (so regional-only's turns sit
// between terroir's, on the same minutes of the machine), the last turn
// holding what is left of the total; an error stops the turns.
func TestEachTurnAlternatesTheModes(t *testing.T) {
	var got []string
	err := eachTurn(5*time.Second, 2*time.Second, 2, func(turn, mode int, d time.Duration) error {
		got = append(got, fmt.Sprintf("%d/%d/%v", turn, mode, d))
		return nil
	})
	want := []string{"0/0/2s", "0/1/2s", "1/0/2s", "1/1/2s", "2/0/1s", "2/1/1s"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("turns = %v, %v; want %v", got, err, want)
	}
	stop := errors.New("stop")
	calls := 0
	err = eachTurn(time.Minute, time.Second, 4, func(turn, mode int, _ time.Duration) error {
		calls++
		if turn == 1 && mode == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 7 {
		t.Errorf("after an error at turn 1, mode 2: %d calls, %v; want 7 and the error", calls, err)
	}
}
