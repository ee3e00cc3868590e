package security_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/transport"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
	"github.com/terroir-db/terroir/internal/txnstate/txnstatepb"
)

// mkCerts makes a CA, node 1's certificate and the users' in a fresh dir.
func mkCerts(t *testing.T, users ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := security.CreateCA(dir, "", security.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := security.CreateNode(dir, "", 1, "us-east1", nil, security.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, u := range users {
		if err := security.CreateClient(dir, "", u, security.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// serve runs a TLS node server with the Transport and Epoch services.
func serve(t *testing.T, certs *security.Certs) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := transport.NewServer(certs)
	r := transport.NewRaft(nil, nil)
	r.Register(s)
	epochpb.RegisterEpochServer(s, epoch.NewServer())
	nodepb.RegisterNodeServer(s, nodepb.UnimplementedNodeServer{}) // refusals come before handlers
	done := make(chan struct{})
	go func() { _ = s.Serve(l); close(done) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return l.Addr().String()
}

func dial(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// calls tries the RPCs a role decides: Ping (any user), the operator's
// SetRegionExcluded (the admin user), SetExcluded, Publish and Raft (nodes
// only), and returns each one's code.
func calls(t *testing.T, c *grpc.ClientConn) map[string]codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]codes.Code{}
	_, err := transportpb.NewTransportClient(c).Ping(ctx, &transportpb.PingRequest{})
	out["Ping"] = status.Code(err)
	_, err = epochpb.NewEpochClient(c).SetExcluded(ctx, &epochpb.SetExcludedRequest{GroupId: 99})
	out["SetExcluded"] = status.Code(err)
	_, err = nodepb.NewNodeClient(c).SetRegionExcluded(ctx, &nodepb.SetRegionExcludedRequest{})
	out["SetRegionExcluded"] = status.Code(err)
	_, err = epochpb.NewEpochClient(c).Publish(ctx, &epochpb.PublishRequest{GroupId: 99})
	out["Publish"] = status.Code(err)
	st, err := transportpb.NewTransportClient(c).Raft(ctx)
	if err == nil {
		_, err = st.CloseAndRecv()
	}
	out["Raft"] = status.Code(err)
	return out
}

func TestRolesDecideWhatACertificateMayCall(t *testing.T) {
	dir := mkCerts(t, "alice", security.AdminUser)
	node, err := security.LoadNode(dir)
	if err != nil {
		t.Fatal(err)
	}
	if id := node.Identity(); id != (security.Identity{Node: 1, Region: "us-east1"}) {
		t.Fatalf("node identity = %+v", id)
	}
	addr := serve(t, node)
	alice, err := security.LoadClient(dir, "alice")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := security.LoadClient(dir, security.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	denied := codes.PermissionDenied
	for _, tc := range []struct {
		who   string
		cfg   *tls.Config
		allow map[string]bool
	}{
		{"user alice", alice.ClientTLS(), map[string]bool{"Ping": true}},
		{"the admin user", admin.ClientTLS(), map[string]bool{"Ping": true, "SetRegionExcluded": true}},
		{"a node", node.ClientTLS(), map[string]bool{"Ping": true, "SetRegionExcluded": true, "SetExcluded": true, "Publish": true, "Raft": true}},
	} {
		got := calls(t, dial(t, addr, tc.cfg))
		for rpc, code := range got {
			if tc.allow[rpc] == (code == denied) || code == codes.Unavailable || code == codes.Unauthenticated {
				t.Errorf("%s calling %s: code %v, allowed %v", tc.who, rpc, code, tc.allow[rpc])
			}
		}
	}
	// The message names the caller and what the RPC needs.
	_, err = epochpb.NewEpochClient(dial(t, addr, alice.ClientTLS())).Publish(context.Background(), &epochpb.PublishRequest{})
	if !strings.Contains(err.Error(), "user alice may not call Epoch/Publish: it is for nodes only") {
		t.Fatalf("refusal = %v", err)
	}
}

func TestPeersWithoutACertificateOfTheCAAreRefused(t *testing.T) {
	dir := mkCerts(t)
	node, err := security.LoadNode(dir)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, node)
	other := mkCerts(t, "mallory") // another CA's user and node
	mallory, err := security.LoadClient(other, "mallory")
	if err != nil {
		t.Fatal(err)
	}
	foreignNode, err := security.LoadNode(other)
	if err != nil {
		t.Fatal(err)
	}
	noCert := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	for name, cfg := range map[string]*tls.Config{
		"a user of another CA": mallory.ClientTLS(), "a node of another CA": foreignNode.ClientTLS(),
		"a TLS client with no certificate": noCert, "a plaintext client": nil,
	} {
		for rpc, code := range calls(t, dial(t, addr, cfg)) {
			if code != codes.Unavailable {
				t.Errorf("%s calling %s: code %v, want the connection refused (Unavailable)", name, rpc, code)
			}
		}
	}
	// A client that trusts only its own CA refuses a node of another CA.
	_, err = transportpb.NewTransportClient(dial(t, serve(t, foreignNode), mkClient(t, dir, "bob").ClientTLS())).Ping(context.Background(), &transportpb.PingRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("ping of a foreign node = %v, want refused as signed by an unknown authority", err)
	}
}

// Calls carried over the Multiplex stream are authorized by their own
// method: any user may open the stream, but each call it carries is
// refused or allowed as the same call alone would be.
func TestMultiplexedCallsAreAuthorizedByTheirOwnMethod(t *testing.T) {
	_, node, alice, addr := nodeAndAlice(t)
	calls := []struct {
		name, method string
		req          proto.Message
	}{
		{"Ping", "/terroir.transport.Transport/Ping", &transportpb.PingRequest{}},
		{"Publish", "/terroir.epoch.Epoch/Publish", &epochpb.PublishRequest{GroupId: 99}},
		{"SetExcluded", "/terroir.epoch.Epoch/SetExcluded", &epochpb.SetExcludedRequest{GroupId: 99}},
	}
	for _, tc := range []struct {
		who   string
		cfg   *tls.Config
		allow map[string]bool
	}{
		{"user alice", alice.ClientTLS(), map[string]bool{"Ping": true}},
		{"a node", node.ClientTLS(), map[string]bool{"Ping": true, "Publish": true, "SetExcluded": true}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := transportpb.NewMultiplexClient(dial(t, addr, tc.cfg)).Calls(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range calls {
			in, _ := proto.Marshal(c.req)
			if err := st.Send(&transportpb.Call{Id: uint64(i + 1), Method: c.method, Request: in}); err != nil {
				t.Fatalf("%s: send %s: %v", tc.who, c.name, err)
			}
			r, err := st.Recv()
			if err != nil {
				t.Fatalf("%s: %s: %v", tc.who, c.name, err)
			}
			var sp spb.Status
			if err := proto.Unmarshal(r.GetStatus(), &sp); err != nil || r.GetId() != uint64(i+1) {
				t.Fatalf("%s: %s: reply %v (%v)", tc.who, c.name, r, err)
			}
			if denied := codes.Code(sp.GetCode()) == codes.PermissionDenied; tc.allow[c.name] == denied {
				t.Errorf("%s calling %s over the Multiplex stream: %v %q, allowed %v", tc.who, c.name, codes.Code(sp.GetCode()), sp.GetMessage(), tc.allow[c.name])
			}
		}
		cancel()
	}
}

// nodeAndAlice makes certificates in a fresh dir and serves node 1 with
// them: its certificates, user alice's, and the server's address.
func nodeAndAlice(t *testing.T) (dir string, node, alice *security.Certs, addr string) {
	t.Helper()
	dir = mkCerts(t, "alice")
	node, err := security.LoadNode(dir)
	if err != nil {
		t.Fatal(err)
	}
	addr = serve(t, node)
	if alice, err = security.LoadClient(dir, "alice"); err != nil {
		t.Fatal(err)
	}
	return dir, node, alice, addr
}

func mkClient(t *testing.T, dir, user string) *security.Certs {
	t.Helper()
	if err := security.CreateClient(dir, "", user, security.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := security.LoadClient(dir, user)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestExpiredCertificatesAreRefusedByName(t *testing.T) {
	dir := mkCerts(t)
	if err := security.CreateClient(dir, "", "old", security.CreateOptions{Lifetime: -time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Loading names the file and the expiry.
	_, err := security.LoadClient(dir, "old")
	if !errors.Is(err, security.ErrExpired) || !strings.Contains(err.Error(), "client.old.crt (old) expired at") {
		t.Fatalf("loading an expired certificate = %v, want ErrExpired naming client.old.crt", err)
	}
	// A client that presents it anyway is refused by the node, with an
	// alert that says why.
	node, err := security.LoadNode(dir)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, node)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.old.crt"), filepath.Join(dir, "client.old.key"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err == nil {
		// TLS 1.3: the client finishes first; the node's verdict arrives as an alert.
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "expired certificate") {
		t.Fatalf("a connection with an expired certificate = %v, want refused as expired", err)
	}
	// An expired node certificate stops the node at start.
	if err := security.CreateNode(dir, "", 1, "us-east1", nil, security.CreateOptions{Lifetime: -time.Minute, Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := security.LoadNode(dir); !errors.Is(err, security.ErrExpired) || !strings.Contains(err.Error(), "node.crt") {
		t.Fatalf("loading an expired node certificate = %v", err)
	}
}

func TestNodeCertificatesReloadWithoutARestart(t *testing.T) {
	dir, _, alice, addr := nodeAndAlice(t)
	served := func() string {
		cfg := alice.ClientTLS()
		cfg.NextProtos = []string{"h2"}
		conn, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := served()
	// Rotate: a new certificate for the same node, written in place.
	if err := security.CreateNode(dir, "", 1, "us-east1", nil, security.CreateOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for served() == before {
		if time.Now().After(deadline) {
			t.Fatal("the node still serves its old certificate 10 s after rotation")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A broken rotation (a key that does not match) keeps the old pair.
	rotated := served()
	if err := os.WriteFile(filepath.Join(dir, security.NodeKeyFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	if got := served(); got != rotated {
		t.Fatalf("after a broken rotation the node serves %s, want the last good %s", got, rotated)
	}
}

func TestCreateRejectsBadInputAndKeepsFiles(t *testing.T) {
	dir := mkCerts(t, "alice")
	ca, _ := os.ReadFile(filepath.Join(dir, security.CACertFile))
	if err := security.CreateCA(dir, "", security.CreateOptions{}); !errors.Is(err, security.ErrExists) {
		t.Fatalf("second create-ca = %v, want ErrExists", err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, security.CACertFile)); string(again) != string(ca) {
		t.Fatal("a refused create-ca changed ca.crt")
	}
	for _, user := range []string{"", "node", "a b", "../x", strings.Repeat("u", 80)} {
		if err := security.CreateClient(dir, "", user, security.CreateOptions{}); !errors.Is(err, security.ErrInvalid) {
			t.Errorf("create-client %q = %v, want ErrInvalid", user, err)
		}
	}
	if err := security.CreateNode(dir, "", 0, "r", nil, security.CreateOptions{}); !errors.Is(err, security.ErrInvalid) {
		t.Errorf("create-node 0 = %v", err)
	}
	if err := security.CreateNode(t.TempDir(), "", 2, "r", nil, security.CreateOptions{}); !errors.Is(err, security.ErrNoCerts) {
		t.Errorf("create-node without a CA = %v, want ErrNoCerts", err)
	}
	if _, err := security.LoadClient(dir, "bob"); !errors.Is(err, security.ErrNoCerts) {
		t.Errorf("load of a missing user = %v, want ErrNoCerts", err)
	}
	// A client certificate is not a node's.
	if err := os.Rename(filepath.Join(dir, "client.alice.crt"), filepath.Join(dir, security.NodeCertFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "client.alice.key"), filepath.Join(dir, security.NodeKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := security.LoadNode(dir); !errors.Is(err, security.ErrBadCert) {
		t.Errorf("a user's certificate loaded as a node's = %v, want ErrBadCert", err)
	}
}

// TestEveryMethodHasARole: each RPC Terroir serves is either listed with a
// role or meant to be node-only; a new RPC must be placed on purpose.
func TestEveryMethodHasARole(t *testing.T) {
	nodeOnly := map[string]bool{
		"/terroir.transport.Transport/Raft": true, "/terroir.transport.Transport/Snapshot": true,
		"/terroir.node.Node/AddRangeReplica": true, "/terroir.node.Node/RemoveRangeReplica": true, "/terroir.epoch.Epoch/Publish": true, "/terroir.epoch.Epoch/SetExcluded": true,
		"/terroir.directory.Directory/Update": true, "/terroir.directory.Directory/Allocate": true,
		"/terroir.directory.Directory/RegisterNode": true, "/terroir.directory.Directory/Heartbeat": true, "/terroir.node.Node/Join": true,
		"/terroir.node.Node/AddGroupReplica": true, "/terroir.node.Node/RemoveGroupReplica": true,
		"/terroir.range.Range/SideClosed": true,
	}
	for _, sd := range []grpc.ServiceDesc{rangepb.Range_ServiceDesc, epochpb.Epoch_ServiceDesc, txnstatepb.TxnState_ServiceDesc,
		directorypb.Directory_ServiceDesc, transportpb.Transport_ServiceDesc, transportpb.Multiplex_ServiceDesc, nodepb.Node_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, m := range names {
			full := "/" + sd.ServiceName + "/" + m
			if role := security.RequiredRole(full); (role == security.RoleNode) != nodeOnly[full] {
				t.Errorf("%s: role %v; list it in methodRoles or in this test's node-only set", full, role)
			}
		}
	}
}
