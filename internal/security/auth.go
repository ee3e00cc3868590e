package security

import (
	"context"
	"log/slog"
	"net"
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
	"/terroir.range.Range/Get":                    RoleUser,
	"/terroir.range.Range/Scan":                   RoleUser,
	"/terroir.range.Range/Lock":                   RoleUser,
	"/terroir.range.Range/Prepare":                RoleUser,
	"/terroir.range.Range/Commit":                 RoleUser,
	"/terroir.range.Range/Abort":                  RoleUser,
	"/terroir.range.Range/CommitOnePhase":         RoleUser,
	"/terroir.range.Range/SnapshotRead":           RoleUser,
	"/terroir.range.Range/Heartbeat":              RoleUser,
	"/terroir.range.Range/Ranges":                 RoleUser,
	"/terroir.range.Range/ClosedEpoch":            RoleUser,
	"/terroir.txnstate.TxnState/Decide":           RoleUser,
	"/terroir.txnstate.TxnState/Get":              RoleUser,
	"/terroir.txnstate.TxnState/Forget":           RoleUser,
	"/terroir.epoch.Epoch/ReadEpoch":              RoleUser,
	"/terroir.epoch.Epoch/ReadEpochs":             RoleUser,
	"/terroir.epoch.Epoch/Membership":             RoleUser,
	"/terroir.directory.Directory/Lookup":         RoleUser,
	"/terroir.directory.Directory/Placement":      RoleUser,
	"/terroir.directory.Directory/List":           RoleUser,
	"/terroir.directory.Directory/GCPolicy":       RoleUser,
	"/terroir.directory.Directory/Protect":        RoleUser, // a changefeed or backup holds back GC
	"/terroir.directory.Directory/Release":        RoleUser,
	"/terroir.directory.Directory/Nodes":          RoleUser, // the node registry: addresses, states, liveness
	"/terroir.directory.Directory/PlacementRules": RoleUser,
	"/terroir.transport.Transport/Ping":           RoleUser,
	"/terroir.transport.Transport/Group":          RoleUser, // a group's configuration, to follow its moves
	"/terroir.transport.Multiplex/Calls":          RoleUser, // each call it carries is authorized by its own method
	"/terroir.node.Node/Status":                   RoleUser, // `terroir status`: the cluster's shape (range boundaries included), no values
	// Operator actions: the admin user. (Excluding a region goes through a
	// node, whose certificate alone may call Epoch/SetExcluded.)
	"/terroir.node.Node/SetRegionExcluded":          RoleAdmin,
	"/terroir.range.Range/AdminSplit":               RoleAdmin,
	"/terroir.range.Range/AdminMerge":               RoleAdmin,
	"/terroir.range.Range/TransferLease":            RoleAdmin,
	"/terroir.range.Range/MoveReplica":              RoleAdmin,
	"/terroir.range.Range/ChangeNonVoter":           RoleAdmin,
	"/terroir.range.Range/Rehome":                   RoleAdmin,
	"/terroir.directory.Directory/SetGCTTL":         RoleAdmin,
	"/terroir.directory.Directory/SetNodeState":     RoleAdmin, // decommission a node
	"/terroir.directory.Directory/SetPlacementRule": RoleAdmin,
	"/terroir.node.Node/MoveGroupReplica":           RoleAdmin,
	// Node-only, listed for the reader: Transport/Raft, Transport/Snapshot,
	// Node/AddRangeReplica, Node/RemoveRangeReplica, Node/AddGroupReplica,
	// Node/RemoveGroupReplica, Epoch/Publish, Epoch/SetExcluded,
	// Directory/Update, Directory/Allocate, Directory/RegisterNode,
	// Directory/Heartbeat, Node/Join.
}

// RequiredRole returns the role method (a full gRPC method name) needs.
func RequiredRole(method string) Role {
	if r, ok := methodRoles[method]; ok {
		return r
	}
	return RoleNode
}

// AuthInfo is a verified TLS connection's information with the identity
// its peer's certificate names, read once at the handshake rather than at
// every RPC.
type AuthInfo struct {
	credentials.TLSInfo
	Identity Identity
	Valid    bool // the certificate names an identity
}

// ServerCredentials returns a node's server credentials: mutual TLS with
// ServerTLS, every refused handshake logged (so an operator sees which peer
// was refused and why: an expired or foreign certificate), and each
// connection's peer identity attached as an AuthInfo.
func (c *Certs) ServerCredentials() credentials.TransportCredentials {
	return serverCreds{credentials.NewTLS(c.ServerTLS())}
}

type serverCreds struct {
	credentials.TransportCredentials
}

func (s serverCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := s.TransportCredentials.ServerHandshake(c)
	if err != nil {
		slog.Warn("TLS handshake refused", "peer", c.RemoteAddr(), "err", err)
		return conn, info, err
	}
	if t, ok := info.(credentials.TLSInfo); ok {
		a := &AuthInfo{TLSInfo: t}
		if ch := t.State.VerifiedChains; len(ch) > 0 && len(ch[0]) > 0 {
			id, err := IdentityOf(ch[0][0])
			a.Identity, a.Valid = id, err == nil
		}
		return conn, a, nil
	}
	return conn, info, nil
}

func (s serverCreds) Clone() credentials.TransportCredentials {
	return serverCreds{s.TransportCredentials.Clone()}
}

// PeerIdentity returns the identity of the verified certificate of the
// caller of ctx; false on a connection not made by ServerCredentials.
func PeerIdentity(ctx context.Context) (Identity, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, false
	}
	a, ok := p.AuthInfo.(*AuthInfo) // ServerCredentials attaches it at the handshake
	if !ok {
		return Identity{}, false
	}
	return a.Identity, a.Valid
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
