package directory

import (
	"sync"
	"time"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
)

// DefaultLivenessTimeout is how long a directory leader goes without a
// node's heartbeat before it counts the node as not live (DESIGN.md §12);
// nodes heartbeat four times as often.
const DefaultLivenessTimeout = 5 * time.Second

// liveness is a directory leader's view of its region's nodes: when it last
// heard from each. It is not replicated: a new leader (a new term) knows
// nothing, and counts a node live only once it heard from it (nodes
// heartbeat four times a timeout), so a dead node never passes for live;
// how long a node has gone unheard counts from the term's start at most,
// so a leader change puts off replacing a dead node, never hastens it.
type liveness struct {
	mu    sync.Mutex
	term  uint64               // the leader term the table belongs to
	since time.Time            // when this replica first served that term
	heard map[uint64]time.Time // last heartbeat by node
}

// reset starts the table over if term is not the one it holds.
func (l *liveness) reset(term uint64, now time.Time) {
	if l.term != term || l.heard == nil {
		l.term, l.since, l.heard = term, now, map[uint64]time.Time{}
	}
}

// beat records a heartbeat from node at now, under term.
func (l *liveness) beat(term, node uint64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reset(term, now)
	l.heard[node] = now
}

// younger returns how long the table, as of now, has left before it is
// age old (zero or less: it is). Call it after view or beat, which set the
// table to the current term.
func (l *liveness) younger(now time.Time, age time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.since.Add(age).Sub(now)
}

// view returns each node's liveness under term at now: live while its last
// heartbeat under term is within timeout. Gone nodes are never live.
func (l *liveness) view(term uint64, now time.Time, timeout time.Duration, nodes []*directorypb.NodeRecord) []*directorypb.NodeLiveness {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reset(term, now)
	out := make([]*directorypb.NodeLiveness, len(nodes))
	for i, n := range nodes {
		last, heard := l.heard[n.GetId()]
		if !heard {
			last = l.since
		}
		ago := now.Sub(last)
		out[i] = &directorypb.NodeLiveness{Node: n, SinceHeartbeatMs: uint64(ago.Milliseconds()),
			Live: heard && ago < timeout && n.GetState() != directorypb.NodeState_NODE_GONE}
	}
	return out
}
