package directory

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
)

// releaseTimeout bounds the leader's release of expired protections.
const releaseTimeout = 2 * time.Second

// renewalWatch is what a server saw of one group's protections: for each,
// the renewals count last seen and when it was first seen at that count.
// Expiry is measured on the observer's own clock, never against a time
// another node wrote, so it needs no clock-skew bound (DESIGN.md §14): a
// replica that restarts or takes over sees every protection afresh.
type renewalWatch struct {
	mu   sync.Mutex
	seen map[uint64]map[string]seenRenewal // by group, by protection id
}

type seenRenewal struct {
	renewals uint64
	at       time.Time
}

// observe records ps as seen at now and returns each one's status.
func (w *renewalWatch) observe(group uint64, ps []*directorypb.Protection, now time.Time) []*directorypb.ProtectionStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		w.seen = map[uint64]map[string]seenRenewal{}
	}
	old := w.seen[group]
	cur := make(map[string]seenRenewal, len(ps))
	out := make([]*directorypb.ProtectionStatus, len(ps))
	for i, p := range ps {
		s, ok := old[p.GetId()]
		if !ok || s.renewals != p.GetRenewals() {
			s = seenRenewal{renewals: p.GetRenewals(), at: now}
		}
		cur[p.GetId()] = s
		idle := now.Sub(s.at)
		out[i] = &directorypb.ProtectionStatus{Protection: p, IdleMs: uint64(idle.Milliseconds()),
			Expired: idle >= time.Duration(p.GetTtlMs())*time.Millisecond}
	}
	w.seen[group] = cur
	return out
}

// GCPolicy implements directorypb.DirectoryServer. The leader releases the
// protections it finds expired (best effort; a later call retries).
func (s *Server) GCPolicy(ctx context.Context, req *directorypb.GCPolicyRequest) (*directorypb.GCPolicyResponse, error) {
	r, err := s.read(ctx, req.GetGroupId())
	if err != nil {
		return nil, err
	}
	st := s.watch.observe(req.GetGroupId(), r.SM.Protections(), time.Now())
	var expired []string
	for _, p := range st {
		if p.GetExpired() {
			expired = append(expired, p.GetProtection().GetId())
		}
	}
	if len(expired) > 0 && r.Group.IsLeader() {
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		_, _ = s.propose(rctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_Release{Release: &directorypb.ReleaseCmd{Ids: expired}}})
		cancel()
	}
	return &directorypb.GCPolicyResponse{GcTtlMs: uint64(r.SM.GCTTL().Milliseconds()), Protections: st}, nil
}

// SetGCTTL implements directorypb.DirectoryServer.
func (s *Server) SetGCTTL(ctx context.Context, req *directorypb.SetGCTTLRequest) (*directorypb.SetGCTTLResponse, error) {
	if err := CheckGCTTL(time.Duration(req.GetGcTtlMs()) * time.Millisecond); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	_, err := s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_SetGcTtl{SetGcTtl: &directorypb.SetGCTTLCmd{GcTtlMs: req.GetGcTtlMs()}}})
	return &directorypb.SetGCTTLResponse{}, err
}

// Protect implements directorypb.DirectoryServer.
func (s *Server) Protect(ctx context.Context, req *directorypb.ProtectRequest) (*directorypb.ProtectResponse, error) {
	if err := checkProtection(req.GetProtection()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	_, err := s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_Protect{Protect: &directorypb.ProtectCmd{Protection: req.GetProtection()}}})
	return &directorypb.ProtectResponse{}, err
}

// Release implements directorypb.DirectoryServer.
func (s *Server) Release(ctx context.Context, req *directorypb.ReleaseRequest) (*directorypb.ReleaseResponse, error) {
	_, err := s.propose(ctx, req.GetGroupId(), &directorypb.Command{Cmd: &directorypb.Command_Release{Release: &directorypb.ReleaseCmd{Ids: []string{req.GetId()}}}})
	return &directorypb.ReleaseResponse{}, err
}
