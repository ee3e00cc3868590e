package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// TestPlacementRules: rules are set, listed with how far the ranges match
// them, and removed; bad ones are refused with typed errors and change
// nothing; a by-row rule refuses a write of a key that names no region.
func TestPlacementRules(t *testing.T) {
	c := localcluster.StartT(t, "../examples/three-regions.yaml", localcluster.Options{})
	ctx := ctxT(t, 60*time.Second)
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []client.PlacementRule{
		{Prefix: []byte("users/"), Kind: client.PlacementByRow},
		{Prefix: []byte("b/cfg/"), Kind: client.PlacementGlobal, Home: "us-east1"},
		{Prefix: []byte("b/orders/"), Kind: client.PlacementHome, Home: "us-east1"},
	} {
		if err := db.SetPlacement(ctx, r); err != nil {
			t.Fatalf("setting %+v: %v", r, err)
		}
	}
	for _, bad := range []struct {
		r    client.PlacementRule
		want error
	}{
		{client.PlacementRule{Prefix: []byte("x/"), Home: "mars"}, client.ErrUnknownRegion},
		{client.PlacementRule{Prefix: []byte("x/"), Home: "us-central1"}, client.ErrUnknownRegion}, // no data there
		{client.PlacementRule{Prefix: []byte("users/eu/"), Home: "us-east1"}, client.ErrPlacementOverlap},
		{client.PlacementRule{Prefix: []byte("b/"), Kind: client.PlacementGlobal, Home: "us-east1"}, client.ErrPlacementOverlap},
		{client.PlacementRule{Prefix: nil, Home: "us-east1"}, client.ErrBadPlacement},
		{client.PlacementRule{Prefix: []byte("x/"), Kind: client.PlacementByRow, Home: "us-east1"}, client.ErrBadPlacement},
		{client.PlacementRule{Prefix: []byte("x/"), Kind: client.PlacementGlobal}, client.ErrBadPlacement},
	} {
		if err := db.SetPlacement(ctx, bad.r); !errors.Is(err, bad.want) {
			t.Errorf("setting %+v: %v, want %v", bad.r, err, bad.want)
		}
	}
	if err := db.RemovePlacement(ctx, []byte("nothing/")); !errors.Is(err, client.ErrNoPlacementRule) {
		t.Errorf("removing a rule that does not exist: %v, want ErrNoPlacementRule", err)
	}
	sts, err := db.Placements(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range sts {
		got = append(got, string(st.Rule.Prefix)+"="+st.Rule.Kind.String())
	}
	if strings.Join(got, " ") != "b/cfg/=global b/orders/=home users/=by-row" {
		t.Fatalf("rules after the refusals: %v", got)
	}
	// b/cfg/ lies inside range 100 and has no non-voter yet: not matched.
	cfg := sts[0]
	if len(cfg.Problems) == 0 || !strings.Contains(strings.Join(cfg.Problems, ";"), "no non-voter in us-west1") {
		t.Fatalf("global rule's status: %v", cfg.Problems)
	}
	// The replicate queue splits at the rules' bounds and gives the global
	// span its non-voter; us-west1 then reads it from its own region.
	deadline := time.Now().Add(45 * time.Second)
	for {
		sts, err := db.Placements(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sts[0].Problems == nil && sts[1].Problems == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ranges do not match the rules 45 s after they were set: %v / %v", sts[0].Problems, sts[1].Problems)
		}
		time.Sleep(200 * time.Millisecond)
	}
	putKey(ctx, t, db, "b/cfg/flag", "on")
	west, err := c.Client("us-west1")
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for range 5 {
		got, st := getIn(ctx, t, west, client.Serializable, "b/cfg/flag")
		served += st.FollowerReads
		_ = got
	}
	if served == 0 {
		t.Fatal("no us-west1 read of the global span was served in us-west1")
	}

	// A by-row key names its region.
	for key, want := range map[string]error{"users/us-east1/1": nil, "users/us-west1/2": nil, "users/mars/3": client.ErrNoRegionInKey, "users/": client.ErrNoRegionInKey} {
		err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error { return tx.Put(ctx, []byte(key), []byte("v")) })
		if !errors.Is(err, want) {
			t.Errorf("writing %q: %v, want %v", key, err, want)
		}
	}
	if err := db.RemovePlacement(ctx, []byte("users/")); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		return tx.Put(ctx, []byte("users/mars/3"), []byte("v"))
	}); err != nil {
		t.Fatalf("the by-row rule removed, writing users/mars/3: %v", err)
	}
}
