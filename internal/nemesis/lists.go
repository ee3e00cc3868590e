package nemesis

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/history"
)

// listCount is how many lists the list-append workload uses, spread over the
// data regions.
const listCount = 6

// lists appends unique elements to lists (one to three per transaction, so
// transactions span regions) and reads lists, locking or in a snapshot of any
// mode, and checks the history with history.CheckLists.
type lists struct {
	cp   *campaign
	mu   sync.Mutex
	ops  []history.ListOp
	last map[int][]int // every list, read after the run
}

func newLists(cp *campaign) *lists { return &lists{cp: cp} }

func (w *lists) key(l int) []byte { return w.cp.key(l, fmt.Sprintf("nemesis-list-%d", l)) }

func (w *lists) run(ctx context.Context, dbs []*client.DB, wg *sync.WaitGroup) {
	for i, db := range dbs {
		wg.Add(1)
		go func() { defer wg.Done(); w.client(ctx, db, 300+i) }()
	}
}

func (w *lists) client(ctx context.Context, db *client.DB, id int) {
	r := rand.New(rand.NewPCG(w.cp.cfg.Seed, uint64(id)))
	for seq := 1; w.cp.waitLoud(ctx); seq++ {
		touched := r.Perm(listCount)[:1+r.IntN(3)]
		op := history.ListOp{Client: id, Reads: map[int][]int{}, Fresh: true}
		var err error
		kind := "list append"
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		op.Call = w.cp.now()
		if r.IntN(2) == 0 {
			op.Appends = map[int]int{}
			for j, l := range touched {
				op.Appends[l] = (id*1_000_000+seq)*4 + j
			}
			err = db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
				for _, l := range touched {
					got, err := w.read(ctx, tx, l)
					if err != nil {
						return err
					}
					op.Reads[l] = got
					if err := tx.Put(ctx, w.key(l), encodeList(append(got, op.Appends[l]))); err != nil {
						return err
					}
				}
				return nil
			})
		} else {
			read := func(ctx context.Context, tx reader) error {
				for _, l := range touched {
					got, err := w.read(ctx, tx, l)
					if err != nil {
						return err
					}
					op.Reads[l] = got
				}
				return nil
			}
			if m := r.IntN(len(snapshotModes) + 1); m == len(snapshotModes) {
				kind = "list read (locking)"
				err = db.Update(octx, func(ctx context.Context, tx *client.Txn) error { return read(ctx, tx) })
			} else {
				mode := snapshotModes[m]
				kind = fmt.Sprintf("list read (%v)", mode)
				op.Fresh = mode != client.Serializable && mode != client.SerializableStale
				_, err = db.View(octx, mode, func(ctx context.Context, s *client.Snapshot) error { return read(ctx, s) })
			}
		}
		op.Return = w.cp.now()
		cancel()
		switch w.cp.countOutcome(kind, err) {
		case committed:
			op.Outcome = history.ListCommitted
		case unknown:
			op.Outcome, op.Return = history.ListUnknown, never
		default:
			op.Outcome = history.ListFailed
		}
		w.mu.Lock()
		w.ops = append(w.ops, op)
		w.mu.Unlock()
	}
}

// read returns list l (empty if unset).
func (w *lists) read(ctx context.Context, tx reader, l int) ([]int, error) {
	v, ok, err := tx.Get(ctx, w.key(l))
	if err != nil || !ok {
		return []int{}, err
	}
	return decodeList(v)
}

func encodeList(l []int) []byte {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = strconv.Itoa(e)
	}
	return []byte(strings.Join(s, " "))
}

func decodeList(v []byte) ([]int, error) {
	fields := strings.Fields(string(v))
	out := make([]int, len(fields))
	for i, f := range fields {
		e, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("nemesis: corrupt list %q: %w", v, err)
		}
		out[i] = e
	}
	return out, nil
}

// final reads every list in one locking transaction.
func (w *lists) final(ctx context.Context, db *client.DB) {
	w.last = map[int][]int{}
	ctx, cancel := context.WithTimeout(ctx, finalReadTimeout)
	defer cancel()
	err := db.Update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for l := range listCount {
			got, err := w.read(ctx, tx, l)
			if err != nil {
				return err
			}
			w.last[l] = got
		}
		return nil
	})
	if err != nil {
		w.cp.anomaly("final read of the lists: %v", err)
	}
}

func (w *lists) check() {
	if w.last == nil {
		return
	}
	for _, a := range history.CheckLists(w.ops, w.last) {
		w.cp.anomaly("lists: %s", a)
	}
}

// dump writes the list history and final state as JSON.
func (w *lists) dump(dir string) error {
	b, err := json.MarshalIndent(struct {
		Ops   []history.ListOp
		Final map[int][]int
	}{w.ops, w.last}, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "history-lists.json"), b, 0o644)
}
