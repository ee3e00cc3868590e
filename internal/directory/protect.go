package directory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
)

// Hold is a protection registered in every region's directory (DESIGN.md
// §14) and renewed in the background until Release: while it lives, no
// range leader of any region collects a version a snapshot at its epoch
// reads. A holder that dies stops renewing, and the protection expires
// ttl after the last renewal each directory replica saw.
//
// A read the protection failed to cover (registered too late, or expired
// while its holder was cut off) fails with ErrSnapshotTooOld at the range;
// the protection is never what makes a read correct, only what lets it
// succeed.
type Hold struct {
	dirs *Directories
	ttl  time.Duration

	mu    sync.Mutex
	p     *directorypb.Protection
	err   error // the last renewal's error; nil once one succeeds
	stop  chan struct{}
	done  chan struct{}
	close sync.Once
}

// Protect registers a protection of epoch, named id (unique per holder;
// description says who holds it), with ttl in every region's directory and
// starts renewing it every ttl/3. Errors: the first region's refusal
// (ErrBadProtection, as InvalidArgument) or ctx's; a partial registration
// is released before it returns.
func (d *Directories) Protect(ctx context.Context, id, description string, epoch uint64, ttl time.Duration) (*Hold, error) {
	h := &Hold{dirs: d, ttl: ttl, stop: make(chan struct{}), done: make(chan struct{}),
		p: &directorypb.Protection{Id: id, Epoch: epoch, TtlMs: uint64(ttl.Milliseconds()), Description: description}}
	if err := h.renew(ctx); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		_ = h.release(rctx)
		return nil, err
	}
	go h.loop()
	return h, nil
}

// renew writes the protection to every region's directory.
func (h *Hold) renew(ctx context.Context) error {
	h.mu.Lock()
	p := h.p
	h.mu.Unlock()
	for _, r := range h.dirs.Regions() {
		if err := h.dirs.Of(r).Protect(ctx, p); err != nil {
			return fmt.Errorf("protecting epoch %d in %s: %w", p.GetEpoch(), r, err)
		}
	}
	return nil
}

func (h *Hold) loop() {
	defer close(h.done)
	t := time.NewTicker(h.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.ttl/3)
		err := h.renew(ctx)
		cancel()
		h.mu.Lock()
		h.err = err
		h.mu.Unlock()
	}
}

// Epoch returns the protected epoch.
func (h *Hold) Epoch() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.p.GetEpoch()
}

// Advance moves the protected epoch to epoch (a changefeed whose
// consumer has resolved past it), from the next renewal on.
func (h *Hold) Advance(epoch uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := proto.CloneOf(h.p) // renew may be sending the old one
	p.Epoch = epoch
	h.p = p
}

// Err returns the last renewal's error (nil once one succeeds): a holder
// that sees one for longer than the ttl may have lost its protection.
func (h *Hold) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Release stops the renewals and drops the protection from every region's
// directory. It is idempotent; errors: the first region's failure (the
// protection then expires by itself).
func (h *Hold) Release(ctx context.Context) error {
	var err error
	h.close.Do(func() {
		close(h.stop)
		<-h.done
		err = h.release(ctx)
	})
	return err
}

func (h *Hold) release(ctx context.Context) error {
	var errs []error
	for _, r := range h.dirs.Regions() {
		if err := h.dirs.Of(r).Release(ctx, h.p.GetId()); err != nil {
			errs = append(errs, fmt.Errorf("releasing in %s: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// SetGCTTL sets gc_ttl in every region's directory (0: back to the
// topology file's). Errors: ErrBadGCTTL out of bounds, before anything
// changes; else the first region's failure (the regions before it keep
// the new value; running it again completes it).
func (d *Directories) SetGCTTL(ctx context.Context, ttl time.Duration) error {
	if err := CheckGCTTL(ttl); err != nil {
		return err
	}
	for _, r := range d.Regions() {
		if err := d.Of(r).SetGCTTL(ctx, ttl); err != nil {
			return fmt.Errorf("%s: %w", r, err)
		}
	}
	return nil
}
