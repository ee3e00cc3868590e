package commitrule

import (
	"errors"
	"testing"

	"github.com/terroir-db/terroir/internal/storage"
)

func TestChooseVersion(t *testing.T) {
	for _, c := range []struct {
		epoch  uint64
		newest storage.VersionID
		want   storage.VersionID
	}{
		{7, storage.VersionID{}, storage.VersionID{Epoch: 7, Counter: 1}},
		{7, storage.VersionID{Epoch: 6, Counter: 9}, storage.VersionID{Epoch: 7, Counter: 1}},
		{7, storage.VersionID{Epoch: 7, Counter: 3}, storage.VersionID{Epoch: 7, Counter: 4}},
		// A newer version than the epoch (a participant's write at a higher
		// epoch than this transaction read): still above it.
		{7, storage.VersionID{Epoch: 9, Counter: 2}, storage.VersionID{Epoch: 9, Counter: 3}},
		{7, storage.VersionID{Epoch: 7, Counter: ^uint32(0)}, storage.VersionID{Epoch: 8, Counter: 1}},
	} {
		if got := ChooseVersion(c.epoch, c.newest); got != c.want {
			t.Errorf("ChooseVersion(%d, %v) = %v, want %v", c.epoch, c.newest, got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	lease := Lease{Start: 10, End: 20}
	for _, c := range []struct {
		local, version uint64
		localVersions  bool
		ok             bool
	}{
		{10, 10, false, true},
		{20, 50, false, true}, // global versions may carry any epoch
		{9, 10, false, false}, // before the lease
		{21, 21, false, false},
		{15, 20, true, true},
		{15, 21, true, false}, // a local-epoch version past the lease's end
	} {
		err := Validate(c.local, c.version, lease, c.localVersions)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrLeaseValidation)) {
			t.Errorf("Validate(local %d, version %d, %v, localVersions %v) = %v; want ok=%v", c.local, c.version, lease, c.localVersions, err, c.ok)
		}
	}
}

func TestVersionEpochAndQuiet(t *testing.T) {
	if got := VersionEpoch(5, 7, 3); got != 7 {
		t.Errorf("VersionEpoch(5, 7, 3) = %d, want 7", got)
	}
	if got := VersionEpoch(5); got != 5 {
		t.Errorf("VersionEpoch(5) = %d, want 5", got)
	}
	for _, c := range []struct {
		e, k  uint64
		quiet bool
	}{{10, 0, false}, {10, 5, true}, {11, 5, false}, {0, 3, true}} {
		if IsQuiet(c.e, c.k) != c.quiet {
			t.Errorf("IsQuiet(%d, %d) = %v", c.e, c.k, !c.quiet)
		}
	}
}
