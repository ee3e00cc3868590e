package epoch

// Sources: reading several epochs at once, and waiting for one to reach
// a value, over any Source.

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// (issue 17). Each read starts before StartAll returns, so the epochs are
// at least those of its call (DESIGN.md §3.1). A *Reader's read joins its
// next round with no goroutine of its own; any other Source is read on a
// goroutine. The function must be called once, and it waits for every
// read to end (ctx bounds them).
func StartAll(ctx context.Context, sources ...Source) func() ([]uint64, error) {
	out := make([]uint64, len(sources))
	errs := make([]error, len(sources))
	started := make([]<-chan readResult, len(sources))
	if len(sources) == 2 {
		if a, ok := sources[0].(*Reader); ok && a.partner != nil && sources[1] == Source(a.partner) {
			ch, err := a.start(true, true) // one joint round reads both (Pair)
			return func() ([]uint64, error) {
				if err != nil {
					return out, err
				}
				res := wait(ctx, ch)
				out[0], out[1] = res.epoch, res.partner
				return out, errors.Join(res.err, res.partnerErr)
			}
		}
	}
	var wg sync.WaitGroup
	for i, src := range sources {
		switch src := src.(type) {
		case nil:
		case *Reader:
			started[i], errs[i] = src.start(true, false)
		default:
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i], errs[i] = ReadBackground(ctx, src)
			}()
		}
	}
	return func() ([]uint64, error) {
		for i, ch := range started {
			if ch != nil {
				res := wait(ctx, ch)
				out[i], errs[i] = res.epoch, res.err
			}
		}
		wg.Wait()
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
