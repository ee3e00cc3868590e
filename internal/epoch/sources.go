package epoch

// Sources: reading several epochs at once, and waiting for one to reach
// a value, over any Source.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/terroir-db/terroir/internal/transport"
)

// Source reads an epoch; *Reader implements it.
type Source interface {
	Read(ctx context.Context) (uint64, error)
}

// backgroundSource is a Source that can read as housekeeping (*Reader).
type backgroundSource interface {
	ReadBackground(ctx context.Context) (uint64, error)
}

// ReadBackground reads src as housekeeping, leaving an idle epoch at its
// idle pace (Reader.ReadBackground); a Source without that kind of read is
// read with Read. Errors as src's.
func ReadBackground(ctx context.Context, src Source) (uint64, error) {
	if b, ok := src.(backgroundSource); ok {
		return b.ReadBackground(ctx)
	}
	return src.Read(ctx)
}

// ReadAll reads every source in parallel (a nil source is skipped and reads as
// 0) and returns the epochs in the order of sources, or the errors joined.
// It reads as a commit does (DESIGN.md §4.2): the epochs current once its
// locks are held, asking none of them to move (ReadBackground), so a
// region that only commits leaves its epochs at their idle pace (Demand).
func ReadAll(ctx context.Context, sources ...Source) ([]uint64, error) {
	return StartAll(ctx, sources...)()
}

// StartAll begins ReadAll's reads and returns the function that waits for
// them and returns what ReadAll does, so a caller can work while the reads
// are under way: a range leader looks up its write set's newest versions
// (issue 17). It is Begin with ctx bounding both the reads and the wait.
func StartAll(ctx context.Context, sources ...Source) func() ([]uint64, error) {
	reading := Begin(ctx, sources...)
	return func() ([]uint64, error) { return reading(ctx) }
}

// Reading waits, bounded by ctx, for the reads Begin started and returns
// their epochs in the order of Begin's sources (a nil source reads as 0),
// or the errors joined (ctx's for a read not answered when ctx ended). Call
// it at most once.
type Reading func(ctx context.Context) ([]uint64, error)

// Begin starts ReadAll's reads of sources now and returns the Reading that
// waits for them: each read starts before Begin returns, so the epochs are
// at least those of its call (DESIGN.md §3.1), however much later the
// Reading is called. ctx bounds the reads themselves. A *Reader's read
// joins its next round with no goroutine of its own, and its answer waits
// in a buffered channel until read, or is dropped with the Reading; any
// other Source is read on a goroutine that ends with its read (ctx bounds
// it). A Reading never called costs its reads and nothing more: a range
// leader reads a transaction's epochs ahead, at its last lock, and may not
// need them (issue 17).
func Begin(ctx context.Context, sources ...Source) Reading {
	started := make([]<-chan readResult, len(sources))
	errs := make([]error, len(sources))
	if len(sources) == 2 {
		if a, ok := sources[0].(*Reader); ok && a.partner != nil && sources[1] == Source(a.partner) {
			ch, err := a.start(true, true) // one joint round reads both (Pair)
			return func(wctx context.Context) ([]uint64, error) {
				if err != nil {
					return make([]uint64, 2), err
				}
				res := wait(wctx, ch)
				return []uint64{res.epoch, res.partner}, errors.Join(res.err, res.partnerErr)
			}
		}
	}
	for i, src := range sources {
		switch src := src.(type) {
		case nil:
		case *Reader:
			started[i], errs[i] = src.start(true, false)
		default:
			ch := make(chan readResult, 1)
			started[i] = ch
			go func() {
				e, err := ReadBackground(ctx, src)
				ch <- readResult{epoch: e, err: err}
			}()
		}
	}
	return func(wctx context.Context) ([]uint64, error) {
		out := make([]uint64, len(sources))
		for i, ch := range started {
			if ch != nil && errs[i] == nil {
				res := wait(wctx, ch)
				out[i], errs[i] = res.epoch, res.err
			}
		}
		return out, errors.Join(errs...)
	}
}

// WaitAtLeast reads src every poll until it shows at least e, and returns the
// epoch read. It fails with the last read's error once ctx ends. Read errors
// before that are retried: a publisher refuses while its lease has lapsed.
func WaitAtLeast(ctx context.Context, src Source, e uint64, poll time.Duration) (uint64, error) {
	for {
		got, err := src.Read(ctx)
		if err == nil && got >= e {
			return got, nil
		}
		if ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("epoch: waiting for epoch %d, at %d: %w", e, got, ctx.Err())
			}
			return got, err
		}
		if !transport.SleepCtx(ctx, poll) {
			return got, fmt.Errorf("epoch: waiting for epoch %d, at %d: %w", e, got, ctx.Err())
		}
	}
}
