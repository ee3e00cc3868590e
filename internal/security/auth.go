package security

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Role is what a caller must be to call an RPC (DESIGN.md §15).
type Role int

const (
	// RoleUser: any certificate of the cluster CA (a user or a node).
	RoleUser Role = iota
	// RoleAdmin: the admin user's certificate, or a node's.
	RoleAdmin
	// RoleNode: a node certificate only — node-to-node traffic.
	RoleNode
)

func (r Role) String() string {
	switch r {
	case RoleUser:
		return "any user"
	case RoleAdmin:
		return "the admin user"
	default:
		return "nodes only"
	}
}

// methodRoles lists every RPC that is not node-only. An RPC missing here
// is node-only, so a new RPC is closed until it is listed (a test checks
// that every served method is listed or meant to be node-only).
var methodRoles = map[string]Role{
	// Transactions, snapshots and changefeeds: any user.
	"/terroir.range.Range/Get":               RoleUser,
	"/terroir.range.Range/Scan":              RoleUser,
	"/terroir.range.Range/Lock":              RoleUser,
	"/terroir.range.Range/Prepare":           RoleUser,
	"/terroir.range.Range/Commit":            RoleUser,
	"/terroir.range.Range/Abort":             RoleUser,
	"/terroir.range.Range/CommitOnePhase":    RoleUser,
	"/terroir.range.Range/SnapshotRead":      RoleUser,
	"/terroir.range.Range/Heartbeat":         RoleUser,
	"/terroir.range.Range/Ranges":            RoleUser,
	"/terroir.range.Range/ClosedEpoch":       RoleUser,
	"/terroir.txnstate.TxnState/Decide":      RoleUser,
	"/terroir.txnstate.TxnState/Get":         RoleUser,
	"/terroir.txnstate.TxnState/Forget":      RoleUser,
	"/terroir.epoch.Epoch/ReadEpoch":         RoleUser,
	"/terroir.epoch.Epoch/Membership":        RoleUser,
	"/terroir.directory.Directory/Lookup":    RoleUser,
	"/terroir.directory.Directory/Placement": RoleUser,
	"/terroir.directory.Directory/List":      RoleUser,
	"/terroir.directory.Directory/GCPolicy":  RoleUser,
	"/terroir.directory.Directory/Protect":   RoleUser, // a changefeed or backup holds back GC
	"/terroir.directory.Directory/Release":   RoleUser,
	"/terroir.transport.Transport/Ping":      RoleUser,
	"/terroir.node.Node/Status":              RoleUser, // `terroir status`: metadata, no keys or values
	// Operator actions: the admin user.
	"/terroir.epoch.Epoch/SetExcluded":      RoleAdmin,
	"/terroir.range.Range/AdminSplit":       RoleAdmin,
	"/terroir.range.Range/AdminMerge":       RoleAdmin,
	"/terroir.directory.Directory/SetGCTTL": RoleAdmin,
	// Node-only, listed for the reader: Transport/Raft, Epoch/Publish,
	// Directory/Update, Directory/Allocate.
}

// RequiredRole returns the role method (a full gRPC method name) needs.
func RequiredRole(method string) Role {
	if r, ok := methodRoles[method]; ok {
		return r
	}
	return RoleNode
}

// PeerIdentity returns the identity of the verified certificate of the
// caller of ctx; false on a connection without TLS.
func PeerIdentity(ctx context.Context) (Identity, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := IdentityOf(info.State.VerifiedChains[0][0])
	return id, err == nil
}

// Authorize fails with codes.PermissionDenied, naming the caller and what
// the method needs, unless the caller of ctx may call method.
func Authorize(ctx context.Context, method string) error {
	id, ok := PeerIdentity(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s needs a certificate of the cluster CA", shortMethod(method))
	}
	need := RequiredRole(method)
	if need == RoleUser || (need == RoleAdmin && id.IsAdmin()) || (need == RoleNode && id.IsNode()) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s may not call %s: it is for %s", id, shortMethod(method), need)
}

func shortMethod(m string) string { return m[strings.LastIndex(m, ".")+1:] }

// ServerInterceptors returns the unary and stream interceptors that run
// Authorize before every RPC of a TLS server.
func ServerInterceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := Authorize(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := Authorize(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
	return unary, stream
}
