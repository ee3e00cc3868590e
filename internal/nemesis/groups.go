package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/history"
)

// groups is the number of independent key groups of history.Keys keys each.
const groups = 4

// txnGroups runs random multi-key transactions, every fourth a linearizable
// snapshot, over one key group at a time, and checks each group's history
// for strict serializability with porcupine.
type txnGroups struct {
	cp        *campaign
	mu        sync.Mutex
	recorders [groups]*history.Recorder
}

func newTxnGroups(cp *campaign) *txnGroups {
	w := &txnGroups{cp: cp}
	for i := range w.recorders {
		w.recorders[i] = &history.Recorder{}
	}
	return w
}

// modelKey names key k of group g. The group's keys are spread over the data
// regions in order (the first ones in the first region), so multi-key
// transactions commit across regions, and the real keys sort as the model's
// do, which the model's scans need.
func (w *txnGroups) modelKey(g int) func(int) []byte {
	return func(k int) []byte {
		return w.cp.key(k*len(w.cp.keys)/history.Keys, fmt.Sprintf("nemesis-g%d-k%d", g, k))
	}
}

func (w *txnGroups) run(ctx context.Context, dbs []*client.DB, wg *sync.WaitGroup) {
	for i, db := range dbs {
		for j := range 2 {
			id := i*2 + j
			wg.Add(1)
			go func() { defer wg.Done(); w.client(ctx, db, id) }()
		}
	}
}

func (w *txnGroups) client(ctx context.Context, db *client.DB, id int) {
	r := rand.New(rand.NewPCG(w.cp.cfg.Seed, uint64(id)))
	for seq := 0; w.cp.waitLoud(ctx); seq++ {
		g := r.IntN(groups)
		snapshot := seq%4 == 3
		txn := history.RandomTxn(r, id+1, seq)
		if snapshot {
			txn = history.RandomReadOnly(r)
		}
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		call := w.cp.now()
		var out history.Outcome
		var err error
		kind := "transaction"
		if snapshot {
			kind = "linearizable snapshot"
			_, err = db.View(octx, client.Linearizable, func(ctx context.Context, s *client.Snapshot) error {
				out, err = Execute(ctx, s, txn, w.modelKey(g))
				return err
			})
		} else {
			err = db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
				out, err = Execute(ctx, tx, txn, w.modelKey(g))
				return err
			})
		}
		ret := w.cp.now()
		cancel()
		w.mu.Lock()
		switch w.cp.countOutcome(kind, err) {
		case committed:
			w.recorders[g].Committed(id, txn, out, call, ret)
		case unknown:
			w.recorders[g].Unknown(id, txn, out, call)
		}
		w.mu.Unlock()
	}
}

// finalReadTimeout bounds each workload's final read (final): a range
// left unavailable after the faults healed is reported as an anomaly
// instead of holding the campaign forever.
const finalReadTimeout = 30 * time.Second

// final reads every group in a locking transaction, so the history's last
// word is the database's state: an acknowledged write that was lost shows up
// as an illegal history.
func (w *txnGroups) final(ctx context.Context, db *client.DB) {
	var txn history.Txn
	for k := 0; k < history.Keys; k++ {
		txn.Ops = append(txn.Ops, history.Op{Kind: history.Get, Key: k})
	}
	for g := range groups {
		var out history.Outcome
		call := w.cp.now()
		octx, cancel := context.WithTimeout(ctx, finalReadTimeout)
		err := db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
			var err error
			out, err = Execute(ctx, tx, txn, w.modelKey(g))
			return err
		})
		cancel()
		if err != nil {
			w.cp.anomaly("final read of group %d: %v", g, err)
			continue
		}
		w.recorders[g].Committed(finalClient, txn, out, call, w.cp.now())
	}
}

// checkTimeout bounds porcupine on one history.
const checkTimeout = 2 * time.Minute

func (w *txnGroups) check() {
	for g, rec := range w.recorders {
		res, _ := porcupine.CheckOperationsVerbose(history.Model, rec.Operations(), checkTimeout)
		switch res {
		case porcupine.Ok:
		case porcupine.Unknown:
			w.cp.anomaly("group %d: porcupine could not decide within %v", g, checkTimeout)
		default:
			committed, _ := rec.Len()
			w.cp.anomaly("group %d: the history of %d transactions is not strictly serializable", g, committed)
		}
	}
}

// dump writes porcupine's visualization of every group's history.
func (w *txnGroups) dump(dir string) error {
	for g, rec := range w.recorders {
		_, info := porcupine.CheckOperationsVerbose(history.Model, rec.Operations(), checkTimeout)
		if err := porcupine.VisualizePath(history.Model, info, filepath.Join(dir, fmt.Sprintf("history-group-%d.html", g))); err != nil {
			return err
		}
	}
	return nil
}
