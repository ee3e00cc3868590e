package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/transport"
)

// FeedEvent is one event of a changefeed: a committed write (Change set), or
// a resolved epoch (Change nil): every change of the span with an epoch at or
// below Resolved has been delivered, so a consumer that applied them holds
// exactly the state a snapshot at Resolved+1 reads (DESIGN.md §14).
type FeedEvent struct {
	Change   *Change
	Resolved uint64
}

// FeedOptions configure a changefeed over the keys in [Start, End) (a nil
// End: to the end of the key space; Prefix builds the span of a prefix).
type FeedOptions struct {
	Start, End []byte
	// From resumes after a resolved epoch: the feed delivers the changes with
	// an epoch above From. FromNow (the default when From is 0 and All is
	// unset) starts at the current epoch instead.
	From uint64
	// All delivers every change the cluster still holds (From 0 included);
	// it fails with ErrSnapshotTooOld once GC has collected any.
	All bool
	// Interval is the time between two rounds (default 100 ms): each round
	// reads the span's closed epoch and the changes up to it. The resolved
	// epoch advances as the ranges close epochs (DESIGN.md §13, every
	// closed_epoch_interval of the topology).
	Interval time.Duration
	// PageSize bounds the versions one range read returns (default 1000;
	// a page ends at a key boundary: one key's versions in a round come in
	// one page, so a round whose window holds more than twice PageSize
	// versions of one key is narrowed).
	PageSize int
	// RoundChanges bounds the changes one round holds in memory (default
	// 100 000): a round whose window of epochs holds more — a feed
	// catching up from far back — is narrowed to fewer epochs, and the
	// next round goes on at once. A single epoch is always delivered whole.
	RoundChanges int
	// OnError, if set, hears each round that failed and will run again (a
	// region cut off, a leader change); the feed goes on.
	OnError func(error)
}

// feedProtectionTTL is how long a changefeed's GC protection outlives its
// last renewal (a feed that dies leaves it this long).
const feedProtectionTTL = time.Minute

// feedRoundTimeout bounds one round of a changefeed; a round that takes
// longer fails (retryable) and runs again.
const feedRoundTimeout = 10 * time.Second

// Prefix returns the span of the keys that start with p: [p, end) for a
// FeedOptions (a nil end when no key sorts after every key with p).
func Prefix(p []byte) (start, end []byte) {
	end = append([]byte{}, p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return p, end[:i+1]
		}
	}
	return p, nil
}

// Changefeed streams the committed writes of a span to fn, in version-id
// order across every region, with a resolved event each time a new epoch
// is resolved (DESIGN.md §14), until ctx ends or fn fails. The resolved
// epochs are the ranges' closed epochs (DESIGN.md §13): each round reads
// the least closed epoch c of the span's ranges, then the span's versions
// in (resolved, c] — final, as every range closed c — from each range
// without an epoch or lock wait, delivers them, then Resolved = c. A round
// that fails part-way delivers nothing and is run again, so a consumer
// sees each change once. Without From or All the feed starts after the
// span's closed epoch: every change that commits after the call is
// delivered (and those above it that committed just before). From must be
// an epoch whose state is known: a resolved epoch of a feed, or e-1 after
// a backup or snapshot at e that read the span.
// While it runs, the feed protects the oldest epoch it still needs from GC
// in every region.
//
// It returns fn's error, ctx's error, ErrInvalidRange for a bad span,
// ErrSnapshotTooOld (nothing delivered) when a range has collected
// versions the feed would need (From below the GC horizon), and any error
// that is not retryable (IsRetryable), such as ErrCrossRegion.
func (db *DB) Changefeed(ctx context.Context, opts FeedOptions, fn func(FeedEvent) error) error {
	if opts.End != nil && bytes.Compare(opts.Start, opts.End) >= 0 {
		return fmt.Errorf("%w: changefeed span [%q, %q)", ErrInvalidRange, opts.Start, opts.End)
	}
	if opts.Interval <= 0 {
		opts.Interval = 100 * time.Millisecond
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 1000
	}
	if opts.RoundChanges <= 0 {
		opts.RoundChanges = 100_000
	}
	lo := opts.Start
	if len(lo) == 0 {
		lo = []byte{0}
	}
	resolved := opts.From
	for !opts.All && resolved == 0 {
		// From now: the span's closed epoch, which a commit from now on
		// cannot be at or below (a range not yet closing any answers 0).
		c, err := db.coord.ClosedEpoch(ctx, lo, opts.End)
		if err != nil {
			return err
		}
		if resolved = c; c == 0 && !transport.SleepCtx(ctx, opts.Interval) {
			return ctx.Err()
		}
	}
	dirs := directory.NewDirectories(db.top, db.dialer)
	hold, err := dirs.Protect(ctx, fmt.Sprintf("changefeed-%d-%d", resolved, time.Now().UnixNano()),
		fmt.Sprintf("changefeed [%q, %q)", opts.Start, opts.End), resolved+1, feedProtectionTTL)
	if err != nil {
		return fmt.Errorf("changefeed: protecting epoch %d from GC: %w", resolved+1, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = hold.Release(rctx)
	}()
	t := time.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		at, changes, behind, err := db.feedRound(ctx, lo, opts.End, resolved+1, opts)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrSnapshotTooOld), err != nil && !IsRetryable(err):
			return err
		case err != nil:
			if opts.OnError != nil {
				opts.OnError(err)
			}
		case at-1 > resolved:
			for i := range changes {
				if err := fn(FeedEvent{Change: &changes[i]}); err != nil {
					return err
				}
			}
			resolved = at - 1
			if err := fn(FeedEvent{Resolved: resolved}); err != nil {
				return err
			}
			hold.Advance(resolved + 1)
			if behind {
				continue // a narrowed round: catch up without waiting
			}
		}
		// A retryable error (a region cut, a leader change) ended the
		// round undelivered: the next one reads the same changes and more.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// ClosedEpoch returns the least closed epoch of the ranges holding keys in
// [start, end) (end nil: to the end of the key space; DESIGN.md §13):
// every version of the span with an epoch at or below it is final, so it
// is the span's resolved epoch, the one a changefeed's next round reaches.
// Errors: ErrInvalidRange, ErrUnavailable.
func (db *DB) ClosedEpoch(ctx context.Context, start, end []byte) (uint64, error) {
	if len(start) == 0 {
		start = []byte{0}
	}
	return db.coord.ClosedEpoch(ctx, start, end)
}

// ViewAt runs fn in a snapshot of the state as of the start of epoch at —
// after a changefeed's resolved epoch r, at = r+1 — read from the ranges'
// closed epochs (DESIGN.md §13): every version at or below at-1 is final
// there, so each read is served with no epoch or lock wait. A range that has
// not yet closed at-1 refuses and the read is tried again until ctx ends
// (ErrUnavailable). Errors: ErrSnapshotTooOld when at is below a range's
// GC horizon, and fn's. Unlike View, fn runs once.
func (db *DB) ViewAt(ctx context.Context, at uint64, fn func(ctx context.Context, s *Snapshot) error) (SnapshotStats, error) {
	s := db.coord.ClosedSnapshot(at)
	err := fn(ctx, &Snapshot{s: s})
	st, _ := s.Finish()
	return st, err
}

// errRoundTooLarge: a round's window holds more than RoundChanges changes.
var errRoundTooLarge = errors.New("changefeed: too many changes in the round's window")

// feedRound reads the span's least closed epoch c and returns at = c+1
// with the span's changes with epochs in [since, at), read from the
// ranges' closed epochs and sorted by version id (then key). A window too
// large for one round (RoundChanges, or one key's versions past twice
// PageSize) is halved, down to one epoch, and behind reports it.
func (db *DB) feedRound(ctx context.Context, lo, hi []byte, since uint64, opts FeedOptions) (at uint64, out []Change, behind bool, err error) {
	// A range whose closed epoch fell below c (a merge keeps the smaller
	// of its halves') refuses until it closes c again: bounded here.
	ctx, cancel := context.WithTimeout(ctx, feedRoundTimeout)
	defer cancel()
	c, err := db.coord.ClosedEpoch(ctx, lo, hi)
	if err != nil {
		return 0, nil, false, err
	}
	at = c + 1
	if at <= since {
		return at, nil, false, nil
	}
	page, most := opts.PageSize, opts.RoundChanges
	for {
		out, err = db.readWindow(ctx, lo, hi, since, at, page, most)
		switch {
		case (errors.Is(err, errRoundTooLarge) || errors.Is(err, ErrTooManyVersions)) && at-since > 1:
			at, behind = since+(at-since)/2, true
		case errors.Is(err, errRoundTooLarge): // one epoch: delivered whole
			most = 0
		case errors.Is(err, ErrTooManyVersions): // one epoch: one key's versions in one page
			page = 0
		default:
			return at, out, behind, err
		}
	}
}

// readWindow reads the span's changes in [since, at) from the closed
// epochs, sorted by version id (then key); errRoundTooLarge past most
// changes (0: no bound).
func (db *DB) readWindow(ctx context.Context, lo, hi []byte, since, at uint64, page, most int) ([]Change, error) {
	s := db.coord.ClosedSnapshot(at)
	defer s.Finish()
	var out []Change
	for {
		part, err := s.Changes(ctx, lo, hi, since, false, page)
		if err != nil {
			return nil, err
		}
		out = append(out, part...)
		if most > 0 && len(out) > most {
			return nil, fmt.Errorf("%w: more than %d in epochs [%d, %d)", errRoundTooLarge, most, since, at)
		}
		if page == 0 || len(part) < page {
			break
		}
		lo = append(append([]byte{}, part[len(part)-1].Key...), 0)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Version != out[j].Version {
			return out[i].Version.Less(out[j].Version)
		}
		return bytes.Compare(out[i].Key, out[j].Key) < 0
	})
	return out, nil
}
