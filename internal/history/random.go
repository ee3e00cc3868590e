package history

import "math/rand/v2"

// RandomTxn returns a transaction of 1–4 random gets, puts, deletes and
// scans; each put writes a value unique to (client, seq, position), so a read
// identifies its writer.
func RandomTxn(r *rand.Rand, client, seq int) Txn {
	var txn Txn
	for i := 0; i < 1+r.IntN(4); i++ {
		op := Op{Kind: OpKind(r.IntN(4)), Key: r.IntN(Keys)}
		switch op.Kind {
		case Put:
			op.Value = client*1_000_000 + seq*10 + i // unique per write
		case Scan:
			op.Hi = op.Key + 1 + r.IntN(Keys-op.Key)
		}
		txn.Ops = append(txn.Ops, op)
	}
	return txn
}

// RandomReadOnly returns a transaction of 1–4 reads (gets and scans).
func RandomReadOnly(r *rand.Rand) Txn {
	var txn Txn
	for i := 0; i < 1+r.IntN(4); i++ {
		op := Op{Kind: Get, Key: r.IntN(Keys)}
		if r.IntN(2) == 0 {
			op.Kind = Scan
			op.Hi = op.Key + 1 + r.IntN(Keys-op.Key)
		}
		txn.Ops = append(txn.Ops, op)
	}
	return txn
}
