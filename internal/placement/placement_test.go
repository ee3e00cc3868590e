package placement

import (
	"errors"
	"strings"
	"testing"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

var regions = []string{"us-east1", "us-west1"}

func rule(prefix string, kind directorypb.PlacementKind, home string) *directorypb.PlacementRule {
	return &directorypb.PlacementRule{Prefix: []byte(prefix), Kind: kind, Home: home}
}

func desc(id uint64, start, end, region string, nonVoters ...uint64) *pb.RangeDescriptor {
	return &pb.RangeDescriptor{RangeId: id, StartKey: []byte(start), EndKey: []byte(end), Region: region, Replicas: []uint64{1, 2, 3}, NonVoters: nonVoters}
}

func TestSpansAndKeys(t *testing.T) {
	sp := Spans(rule("users/", directorypb.PlacementKind_PLACEMENT_BY_ROW, ""), regions)
	if len(sp) != 2 || string(sp[0].Start) != "users/us-east1/" || string(sp[0].End) != "users/us-east10" || sp[0].Home != "us-east1" ||
		string(sp[1].Start) != "users/us-west1/" || sp[1].Home != "us-west1" {
		t.Fatalf("by-row spans: %+v", sp)
	}
	if sp := Spans(rule("cfg/", directorypb.PlacementKind_PLACEMENT_GLOBAL, "us-east1"), regions); len(sp) != 1 || string(sp[0].End) != "cfg0" {
		t.Fatalf("global span: %+v", sp)
	}
	rules := []*directorypb.PlacementRule{rule("users/", directorypb.PlacementKind_PLACEMENT_BY_ROW, ""), rule("cfg/", directorypb.PlacementKind_PLACEMENT_HOME, "us-west1")}
	for key, ok := range map[string]bool{
		"users/us-east1/42": true, "users/us-west1/": true, "cfg/anything": true, "other": true,
		"users/mars/42": false, "users/us-east1": false, "users/": false, "users/us-east142": false,
	} {
		if err := CheckKey(rules, regions, []byte(key)); (err == nil) != ok || err != nil && !errors.Is(err, ErrNoRegionInKey) {
			t.Errorf("CheckKey(%q) = %v, want ok %v", key, err, ok)
		}
	}
}

func TestCheck(t *testing.T) {
	region := func(n uint64) string {
		if n >= 4 {
			return "us-west1"
		}
		return "us-east1"
	}
	global := rule("g/", directorypb.PlacementKind_PLACEMENT_GLOBAL, "us-east1")
	for _, c := range []struct {
		name  string
		descs []*pb.RangeDescriptor
		want  []string // substrings of the problems, in order
	}{
		{"matches", []*pb.RangeDescriptor{desc(1, "", "g/", "us-east1"), desc(2, "g/", "g0", "us-east1", 4), desc(3, "g0", "", "us-east1")}, nil},
		{"straddles", []*pb.RangeDescriptor{desc(1, "", "g/x", "us-east1", 4), desc(2, "g/x", "", "us-east1", 4)}, []string{"range 1", "split", "range 2", "split"}},
		{"no non-voter", []*pb.RangeDescriptor{desc(2, "g/", "g0", "us-east1")}, []string{"no non-voter in us-west1"}},
		{"elsewhere", []*pb.RangeDescriptor{desc(2, "g/", "g0", "us-west1")}, []string{"rehome"}},
	} {
		st := Check(global, regions, c.descs, region)
		got := strings.Join(st.Problems, " | ")
		if st.Matches() != (len(c.want) == 0) {
			t.Errorf("%s: problems %q", c.name, got)
		}
		rest := got
		for _, w := range c.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("%s: problems %q lack %q", c.name, got, w)
				break
			}
			rest = rest[i+len(w):]
		}
	}
}
