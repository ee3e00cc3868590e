package epoch

import (
	"errors"
	"testing"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
)

var errTest = errors.New("unavailable")

func conf(index uint64, halves ...[]uint64) config { return config{index: index, halves: halves} }

// The tally counts a majority only among replies of the newest
// configuration named, in each half of a joint one.
func TestTallyCountsTheNewestConfiguration(t *testing.T) {
	boot := conf(0, []uint64{1, 2, 3})
	for _, tc := range []struct {
		name    string
		replies []reply
		want    uint64 // 0: no decision
	}{
		{"a majority of the bootstrap voters", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 3, epoch: 5, conf: boot}}, 5},
		{"split", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 3, epoch: 6, conf: boot}}, 0},
		{"failures do not count", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 2, err: errTest}, {node: 3, epoch: 6, conf: boot}}, 0},
		// Nodes 1 and 3 lag behind two configuration changes they hold in
		// their logs (or they would abstain): a majority of the bootstrap
		// voters agreeing on 5 proves nothing once node 2 names a newer
		// configuration, {2, 4, 5}, where 9 may have been read already.
		{"stale majority of an old configuration", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 3, epoch: 5, conf: boot},
			{node: 2, epoch: 9, conf: conf(40, []uint64{2, 4, 5})}}, 0},
		{"a majority of the newer configuration", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 3, epoch: 5, conf: boot},
			{node: 2, epoch: 9, conf: conf(40, []uint64{2, 4, 5})}, {node: 5, epoch: 9, conf: conf(40, []uint64{2, 4, 5})}}, 9},
		{"joint: the outgoing half agrees, the incoming does not yet", []reply{
			{node: 1, epoch: 7, conf: conf(30, []uint64{1, 2, 4}, []uint64{1, 2, 3})},
			{node: 3, epoch: 7, conf: conf(30, []uint64{1, 2, 4}, []uint64{1, 2, 3})}}, 0},
		{"joint: both halves agree", []reply{
			{node: 1, epoch: 7, conf: conf(30, []uint64{1, 2, 4}, []uint64{1, 2, 3})},
			{node: 3, epoch: 7, conf: conf(30, []uint64{1, 2, 4}, []uint64{1, 2, 3})},
			{node: 4, epoch: 7, conf: conf(30, []uint64{1, 2, 4}, []uint64{1, 2, 3})}}, 7},
		{"a voter of the newest configuration answering under an older one does not count", []reply{
			{node: 2, epoch: 9, conf: conf(40, []uint64{2, 4, 5})},
			{node: 4, epoch: 9, conf: conf(30, []uint64{1, 2, 4}, []uint64{1, 2, 3})}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTally(boot)
			for _, rep := range tc.replies {
				tl.add(rep)
			}
			got, ok := tl.decide()
			if !ok {
				got = 0
			}
			if got != tc.want {
				t.Fatalf("decided %d (ok %v), want %d", got, ok, tc.want)
			}
		})
	}
}

// A reply naming a newer configuration says so, so the attempt asks its
// voters too; a reply without voters (a node older than configuration
// indexes) counts under the bootstrap configuration.
func TestTallyFollowsNewerConfigurations(t *testing.T) {
	tl := newTally(conf(0, []uint64{1, 2, 3}))
	if tl.add(reply{node: 1, epoch: 5, conf: conf(0, []uint64{1, 2, 3})}) {
		t.Fatal("the known configuration reported as newer")
	}
	if !tl.add(reply{node: 2, epoch: 9, conf: conf(40, []uint64{2, 4}, []uint64{1, 2, 3})}) {
		t.Fatal("a newer configuration not reported")
	}
	if got := tl.newest.members(); len(got) != 4 {
		t.Fatalf("members of the joint configuration %v, want 2, 4, 1, 3", got)
	}
	if c := replyConfig(&epochpb.ReadEpochResponse{Epoch: 3}, []uint64{1, 2, 3}).halves; len(c) != 1 || len(c[0]) != 3 {
		t.Fatalf("a reply without voters counts under %v, want the bootstrap voters", c)
	}
}

// reached certifies "a majority holds at least e" without a majority on
// one value, counted as decide counts: the newest configuration, each half.
func TestTallyReachedNeedsAMajorityAtLeast(t *testing.T) {
	boot := conf(0, []uint64{1, 2, 3})
	joint := conf(30, []uint64{1, 2, 4}, []uint64{1, 2, 3})
	for _, tc := range []struct {
		name    string
		replies []reply
		want    bool
	}{
		{"two replicas past e, on different values", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 3, epoch: 6, conf: boot}}, true},
		{"only one replica at e", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 2, epoch: 4, conf: boot}, {node: 3, epoch: 4, conf: boot}}, false},
		{"a failure does not count", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 2, err: errTest}}, false},
		{"an old configuration's majority does not count", []reply{
			{node: 1, epoch: 5, conf: boot}, {node: 3, epoch: 5, conf: boot},
			{node: 2, epoch: 5, conf: conf(40, []uint64{2, 4, 5})}}, false},
		{"joint: the outgoing half only", []reply{
			{node: 1, epoch: 5, conf: joint}, {node: 3, epoch: 6, conf: joint}}, false},
		{"joint: both halves", []reply{
			{node: 1, epoch: 5, conf: joint}, {node: 3, epoch: 6, conf: joint}, {node: 4, epoch: 7, conf: joint}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTally(boot)
			for _, rep := range tc.replies {
				tl.add(rep)
			}
			if got := tl.reached(5); got != tc.want {
				t.Fatalf("reached(5) = %v, want %v", got, tc.want)
			}
		})
	}
}
