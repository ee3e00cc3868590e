package directory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/storage"
)

// Placement rules (DESIGN.md §13): an operator declares where the keys
// that start with a prefix live — homed in one region, homed by row (each
// key's first component after the prefix names its region), or global
// (homed in one region with a non-voting replica in every other). Every
// region's directory holds a copy of the rules, written one directory
// after another (Directories.SetPlacementRule); a rule is a declaration,
// and the replicate queue of the home region brings the ranges to match.

// Errors of the placement rules. Each crosses the wire as InvalidArgument
// and is typed again on the caller's side (TypedError).
var (
	// ErrBadPlacement: a rule with an empty or oversized prefix, a by-row
	// rule naming a home, or a home or global rule naming none.
	ErrBadPlacement = errors.New("directory: malformed placement rule")
	// ErrPlacementOverlap: the rule's prefix is a prefix of another rule's,
	// or another's is a prefix of it: rules never overlap.
	ErrPlacementOverlap = errors.New("directory: the placement rule overlaps another")
	// ErrNoPlacementRule: no rule has the prefix to remove.
	ErrNoPlacementRule = errors.New("directory: no placement rule has that prefix")
)

// MaxPlacementPrefix is the longest prefix a rule may have, in bytes.
const MaxPlacementPrefix = 1024

// keyRule + prefix → PlacementRule.
const keyRule = 'u'

// RowSeparator ends a by-row key's region component (DESIGN.md §13).
const RowSeparator = '/'

// CheckPlacementRule vets a rule's shape against the cluster's regions
// (nil: skip that check). Errors: ErrBadPlacement, ErrUnknownRegion.
func CheckPlacementRule(r *directorypb.PlacementRule, regions []string) error {
	switch {
	case r == nil || len(r.GetPrefix()) == 0:
		return fmt.Errorf("%w: an empty prefix (a rule covers the keys that start with its prefix)", ErrBadPlacement)
	case len(r.GetPrefix()) > MaxPlacementPrefix:
		return fmt.Errorf("%w: a prefix of %d bytes, at most %d", ErrBadPlacement, len(r.GetPrefix()), MaxPlacementPrefix)
	case r.GetKind() == directorypb.PlacementKind_PLACEMENT_BY_ROW && r.GetHome() != "":
		return fmt.Errorf("%w: a by-row rule names no home: each key's first component does", ErrBadPlacement)
	case r.GetKind() != directorypb.PlacementKind_PLACEMENT_BY_ROW && r.GetHome() == "":
		return fmt.Errorf("%w: %s rule on %q names no home region", ErrBadPlacement, KindName(r.GetKind()), r.GetPrefix())
	case r.GetKind() < directorypb.PlacementKind_PLACEMENT_HOME || r.GetKind() > directorypb.PlacementKind_PLACEMENT_GLOBAL:
		return fmt.Errorf("%w: kind %d", ErrBadPlacement, r.GetKind())
	case regions != nil && r.GetHome() != "" && !slices.Contains(regions, r.GetHome()):
		return fmt.Errorf("%w: %q (the cluster's regions with data: %v)", ErrUnknownRegion, r.GetHome(), regions)
	}
	return nil
}

// KindName is how the CLI spells a placement kind.
func KindName(k directorypb.PlacementKind) string {
	switch k {
	case directorypb.PlacementKind_PLACEMENT_HOME:
		return "home"
	case directorypb.PlacementKind_PLACEMENT_BY_ROW:
		return "by-row"
	case directorypb.PlacementKind_PLACEMENT_GLOBAL:
		return "global"
	}
	return fmt.Sprintf("kind(%d)", k)
}

// overlaps reports whether two prefixes cover common keys: one is a prefix
// of the other.
func overlaps(a, b []byte) bool { return bytes.HasPrefix(a, b) || bytes.HasPrefix(b, a) }

// applyPlacementRule sets, replaces (same prefix) or removes a rule.
func (sm *StateMachine) applyPlacementRule(b *pebble.Batch, c *directorypb.SetPlacementRuleCmd) any {
	r := c.GetRule()
	if c.GetRemove() {
		if len(r.GetPrefix()) == 0 {
			return fmt.Errorf("%w: an empty prefix", ErrBadPlacement)
		}
	} else if err := CheckPlacementRule(r, nil); err != nil {
		return err
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	i, found := slices.BinarySearchFunc(sm.rules, r.GetPrefix(), func(x *directorypb.PlacementRule, p []byte) int { return bytes.Compare(x.GetPrefix(), p) })
	key := sm.key(keyRule, r.GetPrefix()...)
	if c.GetRemove() {
		if !found {
			return fmt.Errorf("%w: %q", ErrNoPlacementRule, r.GetPrefix())
		}
		if err := b.Delete(key, nil); err != nil {
			return err
		}
		sm.rules = slices.Delete(slices.Clone(sm.rules), i, i+1)
		return uint32(0)
	}
	for _, o := range sm.rules {
		if !bytes.Equal(o.GetPrefix(), r.GetPrefix()) && overlaps(o.GetPrefix(), r.GetPrefix()) {
			return fmt.Errorf("%w: %q and the %s rule on %q", ErrPlacementOverlap, r.GetPrefix(), KindName(o.GetKind()), o.GetPrefix())
		}
	}
	v, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	if err := b.Set(key, v, nil); err != nil {
		return err
	}
	rules := slices.Clone(sm.rules)
	if found {
		rules[i] = proto.CloneOf(r)
	} else {
		rules = slices.Insert(rules, i, proto.CloneOf(r))
	}
	sm.rules = rules
	return uint32(0)
}

// PlacementRules returns the rules, by prefix (shared: do not modify).
func (sm *StateMachine) PlacementRules() []*directorypb.PlacementRule {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.rules
}

// writeRules stores rules in b (a snapshot or the seed being written).
func (sm *StateMachine) writeRules(b *pebble.Batch, rules []*directorypb.PlacementRule) error {
	for _, r := range rules {
		v, err := proto.Marshal(r)
		if err != nil {
			return err
		}
		if err := b.Set(sm.key(keyRule, r.GetPrefix()...), v, nil); err != nil {
			return err
		}
	}
	return nil
}

// loadRule decodes a stored rule. Errors wrap storage.ErrCorrupt.
func loadRule(v []byte) (*directorypb.PlacementRule, error) {
	r := &directorypb.PlacementRule{}
	if err := proto.Unmarshal(v, r); err != nil {
		return nil, fmt.Errorf("%w: placement rule: %v", storage.ErrCorrupt, err)
	}
	return r, nil
}

// PlacementRules implements directorypb.DirectoryServer.
func (s *Server) PlacementRules(ctx context.Context, req *directorypb.PlacementRulesRequest) (*directorypb.PlacementRulesResponse, error) {
	r, err := s.read(ctx, req.GetGroupId())
	if err != nil {
		return nil, err
	}
	return &directorypb.PlacementRulesResponse{Rules: r.SM.PlacementRules()}, nil
}

// SetPlacementRule implements directorypb.DirectoryServer.
func (s *Server) SetPlacementRule(ctx context.Context, req *directorypb.SetPlacementRuleRequest) (*directorypb.SetPlacementRuleResponse, error) {
	_, err := s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_SetPlacementRule{
		SetPlacementRule: &directorypb.SetPlacementRuleCmd{Rule: req.GetRule(), Remove: req.GetRemove()}}})
	return &directorypb.SetPlacementRuleResponse{}, err
}

// PlacementRules returns the directory's placement rules, by prefix.
func (c *Client) PlacementRules(ctx context.Context) ([]*directorypb.PlacementRule, error) {
	var out []*directorypb.PlacementRule
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).PlacementRules(ctx, &directorypb.PlacementRulesRequest{GroupId: c.group})
		out = resp.GetRules()
		return err
	})
	return out, TypedError(err)
}

// SetPlacementRule sets (or, with remove, removes) a rule in the
// directory. Errors: ErrBadPlacement, ErrPlacementOverlap,
// ErrNoPlacementRule, or the call's.
func (c *Client) SetPlacementRule(ctx context.Context, r *directorypb.PlacementRule, remove bool) error {
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := directorypb.NewDirectoryClient(conn).SetPlacementRule(ctx, &directorypb.SetPlacementRuleRequest{GroupId: c.group, Rule: r, Remove: remove})
		return err
	})
	return TypedError(err)
}

// SetPlacementRule sets (or, with remove, removes) a placement rule in
// every region's directory, in the topology's order, after checking it
// against the regions with data (regions) and the first directory's rules.
// A failure part way leaves the earlier directories changed: the call can
// be repeated (setting a rule again, or removing one twice from where it
// is gone, is harmless). Errors: ErrBadPlacement, ErrUnknownRegion,
// ErrPlacementOverlap, ErrNoPlacementRule, or a call's, naming the region.
func (d *Directories) SetPlacementRule(ctx context.Context, r *directorypb.PlacementRule, remove bool, regions []string) error {
	if !remove {
		if err := CheckPlacementRule(r, regions); err != nil {
			return err
		}
	}
	for i, region := range d.Regions() {
		err := d.Of(region).SetPlacementRule(ctx, r, remove)
		if remove && i > 0 && errors.Is(err, ErrNoPlacementRule) {
			err = nil // removed from here by an earlier attempt
		}
		if err != nil {
			return fmt.Errorf("%s: %w", region, err)
		}
	}
	return nil
}

// placementErrors are the placement rules' refusals (see registryErrors).
var placementErrors = []error{ErrBadPlacement, ErrPlacementOverlap, ErrNoPlacementRule}

// isPlacementError reports whether err is a refusal of a placement rule.
func isPlacementError(err error) bool {
	return slices.ContainsFunc(placementErrors, func(e error) bool { return errors.Is(err, e) })
}
