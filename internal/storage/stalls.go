package storage

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// stallLogAfter is the shortest write stall logged at WARN; shorter ones
// are logged at INFO (counted either way).
const stallLogAfter = 100 * time.Millisecond

// stalls counts a store's write stalls: the times Pebble held back every
// write of the node (every Raft group's appends and applies at once)
// until its flushes or compactions caught up, because too many memtables
// waited to flush or L0 held too many sublevels (issue 17's steady
// state: a stall longer than a Raft election timeout costs leaders their
// leases).
type stalls struct {
	mu     sync.Mutex
	began  time.Time // zero while writes flow
	reason string
	count  int64
	total  time.Duration
}

// listen adds the stall callbacks to l.
func (s *stalls) listen(l *pebble.EventListener) {
	l.WriteStallBegin = func(info pebble.WriteStallBeginInfo) {
		s.mu.Lock()
		s.began, s.reason = time.Now(), info.Reason
		s.mu.Unlock()
	}
	l.WriteStallEnd = func() {
		s.mu.Lock()
		if s.began.IsZero() {
			s.mu.Unlock()
			return
		}
		took, reason := time.Since(s.began), s.reason
		s.count++
		s.total += took
		s.began = time.Time{}
		s.mu.Unlock()
		level := slog.LevelInfo
		if took >= stallLogAfter {
			level = slog.LevelWarn
		}
		slog.Log(context.Background(), level, "storage: writes stalled", "reason", reason, "for", took.Round(time.Millisecond))
	}
}

// read returns the stalls so far and their total length, the one under
// way included.
func (s *stalls) read() (count int64, total time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	count, total = s.count, s.total
	if !s.began.IsZero() {
		count++
		total += time.Since(s.began)
	}
	return count, total
}

// WriteStalls returns how many times the store has held back all writes
// until its flushes or compactions caught up (a memtable backlog or too
// many L0 sublevels), and how long they lasted in all, counting the
// stall under way, if any.
func (e *Engine) WriteStalls() (count int64, total time.Duration) { return e.stalls.read() }
