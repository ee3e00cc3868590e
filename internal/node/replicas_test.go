package node

import (
	"fmt"
	"testing"

	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
)

// TestUncovered: what a removal may delete of a span, around the spans of
// the ranges still hosted (an empty key: an open end).
func TestUncovered(t *testing.T) {
	d := func(start, end string) *pb.RangeDescriptor {
		return &pb.RangeDescriptor{StartKey: []byte(start), EndKey: []byte(end)}
	}
	for _, c := range []struct {
		start, end string
		others     []*pb.RangeDescriptor
		want       string
	}{
		{"a", "m", nil, "[a m)"},
		{"", "", nil, "[ )"},
		{"a", "m", []*pb.RangeDescriptor{d("m", "z")}, "[a m)"},
		{"a", "m", []*pb.RangeDescriptor{d("f", "m")}, "[a f)"},
		{"", "m", []*pb.RangeDescriptor{d("c", "f"), d("h", "")}, "[ c) [f h)"},
		{"a", "m", []*pb.RangeDescriptor{d("", "")}, ""},
		{"c", "", []*pb.RangeDescriptor{d("a", "d"), d("x", "")}, "[d x)"},
		{"c", "k", []*pb.RangeDescriptor{d("e", "g"), d("a", "d")}, "[d e) [g k)"},
		{"c", "k", []*pb.RangeDescriptor{d("k", "p"), d("a", "b")}, "[c k)"},
	} {
		got := ""
		for i, p := range uncovered([]byte(c.start), []byte(c.end), c.others) {
			if i > 0 {
				got += " "
			}
			got += fmt.Sprintf("[%s %s)", p[0], p[1])
		}
		if got != c.want {
			t.Errorf("[%q, %q) less %v = %s; want %s", c.start, c.end, c.others, got, c.want)
		}
	}
}
