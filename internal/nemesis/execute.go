package nemesis

import (
	"context"
	"strconv"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/history"
)

// KV is what Execute needs: a read-write transaction or a snapshot.
type KV interface {
	Get(ctx context.Context, key []byte) ([]byte, bool, error)
	Scan(ctx context.Context, lo, hi []byte, limit int) ([]client.KeyValue, error)
	Put(ctx context.Context, key, value []byte) error
	Delete(ctx context.Context, key []byte) error
}

// Execute runs the operations of txn in tx, model key k being modelKey(k),
// and returns their results.
func Execute(ctx context.Context, tx KV, txn history.Txn, modelKey func(int) []byte) (history.Outcome, error) {
	var out history.Outcome
	for _, op := range txn.Ops {
		var res history.Result
		switch op.Kind {
		case history.Get:
			v, ok, err := tx.Get(ctx, modelKey(op.Key))
			if err != nil {
				return out, err
			}
			res.Value = history.Absent
			if ok {
				res.Value, _ = strconv.Atoi(string(v))
			}
		case history.Put:
			if err := tx.Put(ctx, modelKey(op.Key), []byte(strconv.Itoa(op.Value))); err != nil {
				return out, err
			}
		case history.Del:
			if err := tx.Delete(ctx, modelKey(op.Key)); err != nil {
				return out, err
			}
		case history.Scan:
			// [first key, just after the last key) holds exactly the scanned keys.
			lo, hi := modelKey(op.Key), append(modelKey(op.Hi-1), 0)
			kvs, err := tx.Scan(ctx, lo, hi, 0)
			if err != nil {
				return out, err
			}
			vals := map[string]int{}
			for _, kv := range kvs {
				vals[string(kv.Key)], _ = strconv.Atoi(string(kv.Value))
			}
			for k := op.Key; k < op.Hi; k++ {
				v, ok := vals[string(modelKey(k))]
				if !ok {
					v = history.Absent
				}
				res.Values = append(res.Values, v)
			}
		}
		out.Results = append(out.Results, res)
	}
	return out, nil
}
