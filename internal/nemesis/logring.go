package nemesis

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
)

// LogRing is a slog.Handler that keeps the last lines the process logged
// at Info and above, as text, whatever the level the process prints at,
// and passes every record on to the handler it wraps. A campaign that
// finds an anomaly writes the lines to its --out directory (log.txt), so
// that a rare failure can be read after the fact: the drain that once
// outlasted its bound left only the warnings of its nodes behind.
type LogRing struct {
	next  slog.Handler
	state *ringState
	text  slog.Handler // formats into state.buf, under state.mu
}

type ringState struct {
	mu    sync.Mutex
	buf   bytes.Buffer // the line being formatted
	lines []string     // a ring of at most cap(lines)
	head  int          // where the next line goes once the ring is full
}

// NewLogRing returns a handler keeping the last n lines (n ≥ 1) logged at
// Info and above, and passing every record on to next.
func NewLogRing(next slog.Handler, n int) *LogRing {
	st := &ringState{lines: make([]string, 0, max(n, 1))}
	return &LogRing{next: next, state: st, text: slog.NewTextHandler(&st.buf, &slog.HandlerOptions{Level: slog.LevelInfo})}
}

// Enabled reports whether a record at level is kept or printed.
func (h *LogRing) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelInfo || h.next.Enabled(ctx, level)
}

// Handle keeps r's text if it is at Info or above, and passes r on if the
// wrapped handler prints its level. Errors: the wrapped handler's.
func (h *LogRing) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelInfo {
		h.state.keep(func() { _ = h.text.Handle(ctx, r) })
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

// WithAttrs returns the handler with attrs added to every record, kept
// and passed on alike.
func (h *LogRing) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &LogRing{next: h.next.WithAttrs(attrs), state: h.state, text: h.text.WithAttrs(attrs)}
}

// WithGroup returns the handler with later attributes under name.
func (h *LogRing) WithGroup(name string) slog.Handler {
	return &LogRing{next: h.next.WithGroup(name), state: h.state, text: h.text.WithGroup(name)}
}

// keep formats one line with format (which writes into buf) and adds it
// to the ring, dropping the oldest once it is full.
func (st *ringState) keep(format func()) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.buf.Reset()
	format()
	line := st.buf.String()
	if len(st.lines) < cap(st.lines) {
		st.lines = append(st.lines, line)
		return
	}
	st.lines[st.head] = line
	st.head = (st.head + 1) % len(st.lines)
}

// Lines returns the lines kept, oldest first, each ending in a newline.
func (h *LogRing) Lines() []string {
	st := h.state
	st.mu.Lock()
	defer st.mu.Unlock()
	return append(append([]string{}, st.lines[st.head:]...), st.lines[:st.head]...)
}
