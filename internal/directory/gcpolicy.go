package directory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/topology"
)

// Errors of the GC policy's commands (DESIGN.md §14).
var (
	// ErrBadGCTTL: a gc_ttl below topology.MinGCTTL (snapshots would fail
	// while they run) or above MaxGCTTL.
	ErrBadGCTTL = errors.New("directory: gc_ttl out of bounds")
	// ErrBadProtection: a protection without an id, or with a ttl outside
	// [MinProtectionTTL, MaxProtectionTTL].
	ErrBadProtection = errors.New("directory: malformed protection")
)

// Bounds of the GC policy's settings.
const (
	// MaxGCTTL is the longest gc_ttl a region accepts.
	MaxGCTTL = 365 * 24 * time.Hour
	// MinProtectionTTL and MaxProtectionTTL bound how long a protection
	// outlives its holder's last renewal.
	MinProtectionTTL = time.Second
	MaxProtectionTTL = 24 * time.Hour
)

// Keys of the GC policy under the group's state prefix.
const (
	keyGCTTL      = 't' // → gc_ttl in ms (8 bytes, big-endian); absent: the topology's
	keyProtection = 'r' // + id → Protection
)

// CheckGCTTL vets a gc_ttl an operator sets (0: the topology's). Errors:
// ErrBadGCTTL.
func CheckGCTTL(ttl time.Duration) error {
	if ttl != 0 && (ttl < topology.MinGCTTL || ttl > MaxGCTTL) {
		return fmt.Errorf("%w: %v is outside [%v, %v]; a shorter one would fail snapshots while they run", ErrBadGCTTL, ttl, topology.MinGCTTL, MaxGCTTL)
	}
	return nil
}

// checkProtection vets a protection. Errors: ErrBadProtection.
func checkProtection(p *directorypb.Protection) error {
	ttl := time.Duration(p.GetTtlMs()) * time.Millisecond
	switch {
	case p == nil || strings.TrimSpace(p.GetId()) == "":
		return fmt.Errorf("%w: no id", ErrBadProtection)
	case ttl < MinProtectionTTL || ttl > MaxProtectionTTL:
		return fmt.Errorf("%w: %q: ttl %v is outside [%v, %v]", ErrBadProtection, p.GetId(), ttl, MinProtectionTTL, MaxProtectionTTL)
	}
	return nil
}

func (sm *StateMachine) applySetGCTTL(b *pebble.Batch, c *directorypb.SetGCTTLCmd) any {
	ttl := time.Duration(c.GetGcTtlMs()) * time.Millisecond
	if err := CheckGCTTL(ttl); err != nil {
		return err
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if err := sm.writeGCTTL(b, c.GetGcTtlMs()); err != nil {
		return err
	}
	sm.gcTTLms = c.GetGcTtlMs()
	return uint32(0)
}

func (sm *StateMachine) writeGCTTL(b *pebble.Batch, ms uint64) error {
	if ms == 0 {
		return b.Delete(sm.key(keyGCTTL), nil)
	}
	return b.Set(sm.key(keyGCTTL), binary.BigEndian.AppendUint64(nil, ms), nil)
}

func (sm *StateMachine) writeProtection(b *pebble.Batch, p *directorypb.Protection) error {
	v, err := proto.Marshal(p)
	if err != nil {
		return err
	}
	return b.Set(sm.key(keyProtection, []byte(p.GetId())...), v, nil)
}

// applyProtect registers a protection or renews it: its renewals count
// rises by one, and its epoch, ttl and description become the command's.
func (sm *StateMachine) applyProtect(b *pebble.Batch, c *directorypb.ProtectCmd) any {
	p := c.GetProtection()
	if err := checkProtection(p); err != nil {
		return err
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	next := proto.CloneOf(p)
	next.Renewals = 0
	i, found := sm.findProtection(p.GetId())
	if found {
		next.Renewals = sm.protections[i].GetRenewals() + 1
	}
	if err := sm.writeProtection(b, next); err != nil {
		return err
	}
	if found {
		sm.protections[i] = next
	} else {
		sm.protections = slices.Insert(sm.protections, i, next)
	}
	return uint32(0)
}

// findProtection returns where the protection id is, or would be, in
// sm.protections (by id). Called with sm.mu held.
func (sm *StateMachine) findProtection(id string) (int, bool) {
	return slices.BinarySearchFunc(sm.protections, id, func(q *directorypb.Protection, id string) int { return strings.Compare(q.GetId(), id) })
}

// applyRelease drops the named protections (an unknown id is no error).
func (sm *StateMachine) applyRelease(b *pebble.Batch, c *directorypb.ReleaseCmd) any {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var n uint32
	for _, id := range c.GetIds() {
		i, found := sm.findProtection(id)
		if !found {
			continue
		}
		if err := b.Delete(sm.key(keyProtection, []byte(id)...), nil); err != nil {
			return err
		}
		sm.protections = slices.Delete(sm.protections, i, i+1)
		n++
	}
	return n
}

// GCTTL returns the region's gc_ttl set at run time (0: none set; the
// topology file's applies).
func (sm *StateMachine) GCTTL() time.Duration {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return time.Duration(sm.gcTTLms) * time.Millisecond
}

// Protections returns the registered protections, by id, expired or not
// (expiry is an observer's judgement: Server.GCPolicy).
func (sm *StateMachine) Protections() []*directorypb.Protection {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	out := make([]*directorypb.Protection, len(sm.protections))
	for i, p := range sm.protections {
		out[i] = proto.CloneOf(p)
	}
	return out
}
