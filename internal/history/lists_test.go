package history

import (
	"strings"
	"testing"
)

// listHistory is a clean history over lists 0 and 1: A appends 1 and 11,
// B appends 2 to list 0, C reads both (fresh), D reads list 0 stale.
func listHistory() ([]ListOp, map[int][]int) {
	ops := []ListOp{
		{Client: 1, Appends: map[int]int{0: 1, 1: 11}, Reads: map[int][]int{0: {}, 1: {}}, Fresh: true, Call: 0, Return: 10},
		{Client: 2, Appends: map[int]int{0: 2}, Reads: map[int][]int{0: {1}}, Fresh: true, Call: 20, Return: 30},
		{Client: 3, Reads: map[int][]int{0: {1, 2}, 1: {11}}, Fresh: true, Call: 40, Return: 50},
		{Client: 4, Reads: map[int][]int{0: {}}, Call: 40, Return: 50},
	}
	return ops, map[int][]int{0: {1, 2}, 1: {11}}
}

func TestCheckListsClean(t *testing.T) {
	ops, final := listHistory()
	if got := CheckLists(ops, final); len(got) != 0 {
		t.Fatalf("a clean history reported %q", got)
	}
}

// TestCheckListsAnomalies: each anomaly, planted in the clean history, is reported.
func TestCheckListsAnomalies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(ops []ListOp, final map[int][]int) ([]ListOp, map[int][]int)
		want  string
	}{
		{"duplicate", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			f[0] = []int{1, 2, 2}
			return ops, f
		}, "twice"},
		{"aborted write visible", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			ops = append(ops, ListOp{Client: 5, Appends: map[int]int{1: 9}, Reads: map[int][]int{1: {11}}, Outcome: ListFailed})
			f[1] = []int{11, 9}
			return ops, f
		}, "failed"},
		{"phantom element", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			f[1] = []int{11, 42}
			return ops, f
		}, "no transaction appended"},
		{"lost write", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			f[0] = []int{1}
			ops[2].Reads[0] = []int{1}
			return ops, f
		}, "lost"},
		{"lost update", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			ops[1].Reads[0] = []int{}
			return ops, f
		}, "after reading 0"},
		{"diverged read", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			ops[3].Reads[0] = []int{2}
			return ops, f
		}, "not a prefix"},
		{"fractured read", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			ops[3].Reads[1] = []int{}
			ops[3].Reads[0] = []int{1}
			return ops, f
		}, "but not to list"},
		{"stale fresh read", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			ops[2].Reads = map[int][]int{0: {1}}
			return ops, f
		}, "returned before it began"},
		{"fresh read behind a stale one", func(ops []ListOp, f map[int][]int) ([]ListOp, map[int][]int) {
			ops = append(ops, ListOp{Client: 6, Reads: map[int][]int{0: {1, 2}}, Call: 31, Return: 35},
				ListOp{Client: 7, Reads: map[int][]int{0: {1}}, Fresh: true, Call: 36, Return: 37})
			ops[1].Return = 40 // the append of 2 itself is still running
			return ops, f
		}, "but op 4, which returned before it began, implies 2"},
	} {
		ops, final := listHistory()
		ops, final = tc.plant(ops, final)
		got := strings.Join(CheckLists(ops, final), "\n")
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: report %q does not mention %q", tc.name, got, tc.want)
		}
	}
}
