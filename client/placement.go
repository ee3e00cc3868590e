package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/placement"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// PlacementKind is how a placement rule homes its keys (DESIGN.md §13).
type PlacementKind int

const (
	// PlacementHome homes every key with the prefix in one region
	// (CockroachDB's REGIONAL BY TABLE).
	PlacementHome PlacementKind = iota
	// PlacementByRow homes each key by its first component after the
	// prefix, up to '/': prefix + "us-east1/42" lives in us-east1
	// (REGIONAL BY ROW).
	PlacementByRow
	// PlacementGlobal homes every key with the prefix in one region and
	// keeps a non-voting replica in every other region, which serves
	// snapshot reads there (GLOBAL tables).
	PlacementGlobal
)

// String spells the kind as the CLI does.
func (k PlacementKind) String() string { return directory.KindName(directorypb.PlacementKind(k)) }

// PlacementRule declares where the keys that start with Prefix live.
type PlacementRule struct {
	Prefix []byte
	Kind   PlacementKind
	// Home is the home region of a PlacementHome or PlacementGlobal rule;
	// empty for PlacementByRow.
	Home string
}

// PlacementStatus is a rule and how far the ranges match it.
type PlacementStatus struct {
	Rule PlacementRule
	// Problems lists what differs from the rule (empty: the data matches):
	// a split, a rehome or a non-voter still due.
	Problems []string
}

// Errors of placement rules.
var (
	// ErrBadPlacement: a rule with an empty prefix, a by-row rule naming a
	// home, or a home or global rule naming none.
	ErrBadPlacement = directory.ErrBadPlacement
	// ErrPlacementOverlap: the rule's prefix is a prefix of another rule's,
	// or the other way round.
	ErrPlacementOverlap = directory.ErrPlacementOverlap
	// ErrNoPlacementRule: RemovePlacement of a prefix no rule has.
	ErrNoPlacementRule = directory.ErrNoPlacementRule
	// ErrNoRegionInKey: a key under a by-row rule whose first component is
	// not a region with data.
	ErrNoRegionInKey = placement.ErrNoRegionInKey
)

func (r PlacementRule) proto() *directorypb.PlacementRule {
	return &directorypb.PlacementRule{Prefix: r.Prefix, Kind: directorypb.PlacementKind(r.Kind), Home: r.Home}
}

// SetPlacement sets a placement rule (DESIGN.md §13), replacing the rule
// with the same prefix, in every region's directory: an operator's action
// (`terroir admin placement set`). The replicate queues then bring the
// ranges to match it. Errors: ErrBadPlacement, ErrUnknownRegion,
// ErrPlacementOverlap (nothing changed), ErrUnavailable; a failure in a
// later region leaves earlier ones set, and the call can be repeated.
func (db *DB) SetPlacement(ctx context.Context, r PlacementRule) error {
	if r.Home != "" && !db.top.HasRegion(r.Home) {
		return fmt.Errorf("%w: %q", ErrUnknownRegion, r.Home)
	}
	dirs := directory.NewDirectories(db.top, db.dialer)
	if err := db.placementErr(dirs.SetPlacementRule(ctx, r.proto(), false, dirs.Regions())); err != nil {
		return err
	}
	_ = db.coord.RefreshPlacement(ctx) // this handle's writes check by-row keys at once
	return nil
}

// RemovePlacement removes the rule with prefix from every directory. The
// data stays where it is. Errors: ErrNoPlacementRule, ErrUnavailable.
func (db *DB) RemovePlacement(ctx context.Context, prefix []byte) error {
	dirs := directory.NewDirectories(db.top, db.dialer)
	if err := db.placementErr(dirs.SetPlacementRule(ctx, &directorypb.PlacementRule{Prefix: prefix}, true, nil)); err != nil {
		return err
	}
	_ = db.coord.RefreshPlacement(ctx)
	return nil
}

// Placements returns the placement rules, by prefix, each with how far
// the ranges of every region match it (`terroir admin placement list`).
// Errors: ErrUnavailable.
func (db *DB) Placements(ctx context.Context) ([]PlacementStatus, error) {
	dirs := directory.NewDirectories(db.top, db.dialer)
	regions := dirs.Regions()
	if len(regions) == 0 {
		return nil, nil
	}
	rules, err := dirs.Of(regions[0]).PlacementRules(ctx)
	if err != nil {
		return nil, db.placementErr(err)
	}
	var descs []*pb.RangeDescriptor
	for _, r := range regions {
		ds, err := dirs.Of(r).List(ctx)
		if err != nil {
			return nil, db.placementErr(fmt.Errorf("%s: %w", r, err))
		}
		descs = append(descs, ds...)
	}
	net := db.dialer.Network()
	nodeRegion := func(id uint64) string { n, _ := net.Resolve(id); return n.Region }
	out := make([]PlacementStatus, 0, len(rules))
	for _, r := range rules {
		st := placement.Check(r, regions, descs, nodeRegion)
		out = append(out, PlacementStatus{Rule: PlacementRule{Prefix: slices.Clone(r.GetPrefix()), Kind: PlacementKind(r.GetKind()), Home: r.GetHome()},
			Problems: st.Problems})
	}
	return out, nil
}

// Ranges returns every range of the cluster as the regions' directories
// hold them, by start key: where each span is homed, on which replicas
// and non-voters (DESIGN.md §11, §13). Errors: ErrUnavailable.
func (db *DB) Ranges(ctx context.Context) ([]RangeInfo, error) {
	dirs := directory.NewDirectories(db.top, db.dialer)
	var out []RangeInfo
	for _, r := range dirs.Regions() {
		ds, err := dirs.Of(r).List(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w: the %s directory: %v", ErrUnavailable, r, err)
		}
		for _, d := range ds {
			out = append(out, rangeInfo(d))
		}
	}
	slices.SortFunc(out, func(a, b RangeInfo) int { return bytes.Compare(a.Start, b.Start) })
	return out, nil
}

// placementErr passes the placement refusals on as they are, and marks
// every other failure ErrUnavailable.
func (db *DB) placementErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, directory.ErrUnknownRegion): // a region without data
		return fmt.Errorf("%w: %v", ErrUnknownRegion, err)
	case errors.Is(err, ErrBadPlacement), errors.Is(err, ErrPlacementOverlap), errors.Is(err, ErrNoPlacementRule):
		return err
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}
