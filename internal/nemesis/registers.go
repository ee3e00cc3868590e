package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/anishathalye/porcupine"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/history"
)

// registerCount is how many single-key registers the register workload uses,
// spread over the data regions.
const registerCount = 8

// linearizableModes are the snapshot modes whose single-key reads are
// linearizable (Regional only on keys of its own region; on others it reruns
// as Linearizable).
var linearizableModes = []client.SnapshotMode{client.Strong, client.StrongLocal, client.Linearizable, client.Regional}

// registers runs writes, compare-and-sets and reads on single keys, reads
// either locking or in a snapshot of a per-key linearizable mode, and checks
// them with porcupine's register model.
type registers struct {
	cp    *campaign
	mu    sync.Mutex
	ops   []porcupine.Operation
	kinds []string // of ops, by index: what the client ran
	// failed: the writes a client was told failed, by value (unique per
	// write), with the error: a read of one is an anomaly to name.
	failed map[int]string
}

func newRegisters(cp *campaign) *registers { return &registers{cp: cp, failed: map[int]string{}} }

func (w *registers) key(k int) []byte { return w.cp.key(k, fmt.Sprintf("nemesis-reg-%d", k)) }

func (w *registers) run(ctx context.Context, dbs []*client.DB, wg *sync.WaitGroup) {
	for i, db := range append(slices.Clone(dbs), w.cp.followers...) { // the latter's reads prefer followers
		wg.Add(1)
		go func() { defer wg.Done(); w.client(ctx, db, 200+i) }()
	}
}

func (w *registers) client(ctx context.Context, db *client.DB, id int) {
	r := rand.New(rand.NewPCG(w.cp.cfg.Seed, uint64(id)))
	seen := map[int]int{} // register → the value this client last saw
	for seq := 1; w.cp.waitLoud(ctx); seq++ {
		in := history.RegisterInput{Key: r.IntN(registerCount), Value: id*1_000_000 + seq}
		var out history.RegisterOutput
		var err error
		kind := ""
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		call := w.cp.now()
		switch p := r.IntN(10); {
		case p < 2:
			in.Kind, kind = history.RegWrite, "register write"
			err = db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
				return tx.Put(ctx, w.key(in.Key), []byte(strconv.Itoa(in.Value)))
			})
		case p < 4:
			in.Kind, kind = history.RegWrite, "register write (one round trip)"
			_, err = db.Put(octx, w.key(in.Key), []byte(strconv.Itoa(in.Value)))
		case p < 6:
			in.Kind, kind = history.RegCAS, "register compare-and-set"
			in.Expected = history.Absent
			if v, ok := seen[in.Key]; ok {
				in.Expected = v
			}
			err = db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
				v, err := w.get(ctx, tx, in.Key)
				if out.OK = err == nil && v == in.Expected; !out.OK {
					return err
				}
				return tx.Put(ctx, w.key(in.Key), []byte(strconv.Itoa(in.Value)))
			})
		case p < 7:
			in.Kind, kind = history.RegRead, "register read (locking)"
			err = db.Update(octx, func(ctx context.Context, tx *client.Txn) (err error) {
				out.Value, err = w.get(ctx, tx, in.Key)
				return err
			})
		case p < 8:
			in.Kind, kind = history.RegRead, "register read (one round trip)"
			out.Value, err = w.get(octx, db, in.Key)
		default:
			mode := linearizableModes[r.IntN(len(linearizableModes))]
			in.Kind, kind = history.RegRead, fmt.Sprintf("register read (%v)", mode)
			var st client.SnapshotStats
			st, err = db.View(octx, mode, func(ctx context.Context, s *client.Snapshot) (err error) {
				out.Value, err = w.get(ctx, s, in.Key)
				return err
			})
			if err == nil && st.FollowerReads > 0 {
				w.cp.count(fmt.Sprintf("register read (%v) served by a follower", mode))
			}
		}
		ret := w.cp.now()
		cancel()
		switch w.cp.countOutcome(kind, err) {
		case committed:
			switch {
			case in.Kind == history.RegRead:
				seen[in.Key] = out.Value
			case in.Kind == history.RegWrite || out.OK:
				seen[in.Key] = in.Value
			}
			w.record(id, kind, in, out, call, ret)
		case unknown:
			w.record(id, kind, in, history.RegisterOutput{Unknown: true}, call, never)
		case failed:
			if in.Kind != history.RegRead {
				w.mu.Lock()
				w.failed[in.Value] = fmt.Sprintf("%s of %d to register %d by client %d at %s: %v", kind, in.Value, in.Key, id, span(call, ret), err)
				w.mu.Unlock()
			}
		}
	}
}

// get reads register k (Absent if unset).
func (w *registers) get(ctx context.Context, tx reader, k int) (int, error) {
	v, ok, err := tx.Get(ctx, w.key(k))
	if err != nil || !ok {
		return history.Absent, err
	}
	return strconv.Atoi(string(v))
}

func (w *registers) record(id int, kind string, in history.RegisterInput, out history.RegisterOutput, call, ret int64) {
	w.mu.Lock()
	w.ops = append(w.ops, porcupine.Operation{ClientId: id, Input: in, Output: out, Call: call, Return: ret})
	w.kinds = append(w.kinds, kind)
	w.mu.Unlock()
}

// span formats an operation's call and return, in seconds since the
// campaign began (never: its outcome is unknown).
func span(call, ret int64) string {
	if ret == never {
		return fmt.Sprintf("%.3f s–(unknown)", float64(call)/1e9)
	}
	return fmt.Sprintf("%.3f–%.3f s", float64(call)/1e9, float64(ret)/1e9)
}

// name describes operation i for a witness: what it was, its client and
// its times.
func (w *registers) name(i int) string {
	op := w.ops[i]
	return fmt.Sprintf("%s (%s) by client %d at %s", w.kinds[i], history.RegisterModel.DescribeOperation(op.Input, op.Output), op.ClientId, span(op.Call, op.Return))
}

// witnessCount bounds the witnesses a failed check names.
const witnessCount = 5

// final reads every register in a locking transaction.
func (w *registers) final(ctx context.Context, db *client.DB) {
	for k := range registerCount {
		call := w.cp.now()
		var v int
		octx, cancel := context.WithTimeout(ctx, finalReadTimeout)
		err := db.Update(octx, func(ctx context.Context, tx *client.Txn) (err error) {
			v, err = w.get(ctx, tx, k)
			return err
		})
		cancel()
		if err != nil {
			w.cp.anomaly("final read of register %d: %v", k, err)
			continue
		}
		w.record(finalClient, "final read (locking)", history.RegisterInput{Key: k, Kind: history.RegRead}, history.RegisterOutput{Value: v}, call, w.cp.now())
	}
}

func (w *registers) check() {
	switch res, _ := porcupine.CheckOperationsVerbose(history.RegisterModel, w.ops, checkTimeout); res {
	case porcupine.Ok:
	case porcupine.Unknown:
		w.cp.anomaly("registers: porcupine could not decide within %v", checkTimeout)
	default:
		w.cp.anomaly("registers: the history of %d operations is not linearizable", len(w.ops))
		w.explain()
	}
}

// explain records, as anomalies, the witnesses of an illegal history:
// reads of a value whose write was reported failed, and the reads
// history.RegisterWitnesses names (none if the illegality spans more
// operations than it looks at; the dump then shows it).
func (w *registers) explain() {
	n := 0
	for i, op := range w.ops {
		in, out := op.Input.(history.RegisterInput), op.Output.(history.RegisterOutput)
		if f, ok := w.failed[out.Value]; ok && in.Kind == history.RegRead && !out.Unknown && n < witnessCount {
			w.cp.anomaly("registers: %s read the value of a write reported failed: %s", w.name(i), f)
			n++
		}
	}
	for _, s := range history.RegisterWitnesses(w.ops, w.name, witnessCount) {
		w.cp.anomaly("registers: %s", s)
	}
}

func (w *registers) dump(dir string) error {
	_, info := porcupine.CheckOperationsVerbose(history.RegisterModel, w.ops, checkTimeout)
	return porcupine.VisualizePath(history.RegisterModel, info, filepath.Join(dir, "history-registers.html"))
}
