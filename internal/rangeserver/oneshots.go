package rangeserver

import (
	"errors"
	"sync"
	"time"
)

// ErrDuplicate: a single-request transaction (OnePhaseRequest.take_locks)
// came again under an ID this replica has already begun, as a
// retransmission the network delivered late or early would. It is refused
// without running: the first copy may have committed, so its sender must
// take the outcome as unknown (a read may simply be asked again under a
// new ID).
var ErrDuplicate = errors.New("rangeserver: a transaction sent whole came again under the same ID")

// oneShotMemory is how long a replica at least remembers the IDs of the
// single-request transactions it began: 10 s, far beyond any delay a
// retransmitted request can have (each attempt of a client's request uses
// a new ID, so only a copy of one attempt comes again).
const oneShotMemory = 10 * time.Second

// oneShots is the set of single-request transaction IDs a replica began
// in the last oneShotMemory to 2·oneShotMemory, in two generations: a
// transaction sent whole runs at most once here within that memory. It is
// a backstop against retransmitted copies, in memory only: a copy that
// reaches another replica after leadership moved, or this one after a
// restart, is not caught (clients and gRPC never resend an ID). Its memory
// is about 40 bytes per transaction per generation.
type oneShots struct {
	mu        sync.Mutex
	cur, prev map[string]struct{}
	since     time.Time // when cur started
}

// claim records id at now and reports whether it is new: false means a
// copy of the request began here before.
func (o *oneShots) claim(id []byte, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cur == nil || now.Sub(o.since) >= oneShotMemory {
		o.prev, o.cur, o.since = o.cur, make(map[string]struct{}), now
	}
	if _, ok := o.cur[string(id)]; ok {
		return false
	}
	if _, ok := o.prev[string(id)]; ok {
		return false
	}
	o.cur[string(id)] = struct{}{}
	return true
}
