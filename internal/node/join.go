package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/directory"
	"github.com/terroir-db/terroir/internal/directory/directorypb"
	"github.com/terroir-db/terroir/internal/node/nodepb"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
)

// Joining (DESIGN.md §12): a node that is not in the bootstrap file asks
// any node of the cluster (Node/Join) to register it with its region's
// registry and gets the cluster's topology back — the file's settings,
// regions and groups with every registered node. It keeps that topology in
// its data directory, so it restarts even when no peer it names answers.

// JoinedTopologyFile is the file, in a joined node's data directory, that
// keeps the topology its join returned.
const JoinedTopologyFile = "joined-topology.yaml"

// joinAttempt bounds one peer's answer to Join.
const joinAttempt = 10 * time.Second

// JoinConfig is what a node that joins says about itself.
type JoinConfig struct {
	// Peers are host:port addresses of nodes of the cluster; each is tried
	// in turn.
	Peers []string
	// NodeID, Region and Addr are the joiner's id, region and RPC address.
	NodeID uint64
	Region string
	Addr   string
	// DataDir is the joiner's data directory: empty (or absent) means a
	// new node, whose id must be new to the cluster.
	DataDir string
	// Certs are the joiner's node certificates; nil with Insecure for a
	// plaintext cluster.
	Certs    *security.Certs
	Insecure bool
}

// Join registers the node cfg describes with the cluster and returns the
// topology to start it with (and stores it in the data directory). When no
// peer answers, a topology an earlier join stored is returned instead.
// Errors: the registry's refusals (directory.ErrUnknownRegion,
// ErrDuplicateAddr, ErrNodeExists, ErrNodeGone, ErrBadNode), nothing
// changed; or no peer answered and nothing is stored.
func Join(ctx context.Context, cfg JoinConfig) (*topology.Topology, error) {
	if cfg.Certs == nil && !cfg.Insecure {
		return nil, fmt.Errorf("node: %w: a joining node needs certificates (or --insecure)", security.ErrNoCerts)
	}
	creds := insecure.NewCredentials()
	if cfg.Certs != nil {
		creds = credentials.NewTLS(cfg.Certs.ClientTLS())
	}
	req := &nodepb.JoinRequest{NodeId: cfg.NodeID, Region: cfg.Region, Addr: cfg.Addr, Fresh: emptyDir(cfg.DataDir)}
	saved := filepath.Join(cfg.DataDir, JoinedTopologyFile)
	var errs []error
	for _, peer := range cfg.Peers {
		top, err := joinVia(ctx, peer, creds, req)
		if err == nil {
			data, err := top.Marshal()
			if err == nil {
				err = writeFileSync(cfg.DataDir, saved, data)
			}
			if err != nil {
				return nil, fmt.Errorf("node: keeping the joined topology in %s: %w", saved, err)
			}
			return top, nil
		}
		if directory.IsRegistryError(err) {
			return nil, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", peer, err))
	}
	if top, err := topology.Load(saved); err == nil {
		slog.Warn("no peer answered the join; starting with the topology of the last join", "file", saved, "err", errors.Join(errs...))
		return top, nil
	}
	return nil, fmt.Errorf("node: no peer answered the join (%s): %w", strings.Join(cfg.Peers, ", "), errors.Join(errs...))
}

// joinVia asks one peer to register the joiner.
func joinVia(ctx context.Context, peer string, creds credentials.TransportCredentials, req *nodepb.JoinRequest) (*topology.Topology, error) {
	conn, err := grpc.NewClient(peer, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, joinAttempt)
	defer cancel()
	resp, err := nodepb.NewNodeClient(conn).Join(ctx, req)
	if err != nil {
		return nil, directory.TypedError(err)
	}
	top, err := topology.Parse(resp.GetTopology())
	if err != nil {
		return nil, fmt.Errorf("the topology it returned: %w", err)
	}
	if self, ok := top.Node(req.GetNodeId()); !ok || self.Addr != req.GetAddr() || self.Region != req.GetRegion() {
		return nil, fmt.Errorf("the topology it returned does not name node %d at %s in %s", req.GetNodeId(), req.GetAddr(), req.GetRegion())
	}
	return top, nil
}

// emptyDir reports whether dir is absent or holds nothing but a joined
// topology.
func emptyDir(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	for _, e := range ents {
		if e.Name() != JoinedTopologyFile {
			return false
		}
	}
	return true
}

// writeFileSync writes data to path in dir durably (a temporary file,
// fsync'd, renamed over path).
func writeFileSync(dir, path string, data []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Join implements nodepb.NodeServer: it vets the joiner against every
// region's registry, registers it with its region's, and returns the
// cluster's topology with every registered node.
func (s *statusServer) Join(ctx context.Context, req *nodepb.JoinRequest) (*nodepb.JoinResponse, error) {
	n := s.n
	refuse := func(err error) (*nodepb.JoinResponse, error) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if id, ok := security.PeerIdentity(ctx); ok && (id.Node != req.GetNodeId() || id.Region != req.GetRegion()) {
		return nil, status.Errorf(codes.PermissionDenied, "%s may not join as node %d in %s", id, req.GetNodeId(), req.GetRegion())
	}
	dir := n.dirs.Of(req.GetRegion())
	if dir == nil {
		return refuse(fmt.Errorf("%w: %q (regions with a directory: %v)", directory.ErrUnknownRegion, req.GetRegion(), n.dirs.Regions()))
	}
	registry, err := n.dirs.Registry(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reading the registry: %v", err)
	}
	var all []*directorypb.NodeRecord
	for _, l := range registry {
		all = append(all, l.GetNode())
	}
	for _, rec := range all {
		switch {
		case rec.GetId() == req.GetNodeId() && rec.GetState() == directorypb.NodeState_NODE_GONE:
			return refuse(fmt.Errorf("%w: node %d was decommissioned; join with a new id", directory.ErrNodeGone, rec.GetId()))
		case rec.GetId() == req.GetNodeId() && (rec.GetRegion() != req.GetRegion() || req.GetFresh() && rec.GetAddr() != req.GetAddr()):
			// (The same id, region and address again is a join repeated
			// after a lost reply.)
			return refuse(fmt.Errorf("%w: node %d is registered in %s at %s; a node with an empty store joins with a new id", directory.ErrNodeExists, rec.GetId(), rec.GetRegion(), rec.GetAddr()))
		case rec.GetId() != req.GetNodeId() && rec.GetAddr() == req.GetAddr() && rec.GetState() != directorypb.NodeState_NODE_GONE:
			return refuse(fmt.Errorf("%w: node %d is registered at %s", directory.ErrDuplicateAddr, rec.GetId(), rec.GetAddr()))
		}
	}
	rec := &directorypb.NodeRecord{Id: req.GetNodeId(), Region: req.GetRegion(), Addr: req.GetAddr()}
	if err := dir.RegisterNode(ctx, rec, true); err != nil {
		if directory.IsRegistryError(err) {
			return refuse(err)
		}
		return nil, status.Errorf(codes.Unavailable, "registering node %d: %v", req.GetNodeId(), err)
	}
	top, err := registeredTopology(n.cfg.Topology, append(all, rec))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "the registry: %v", err)
	}
	data, err := top.Marshal()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	n.cfg.Network.SetNodes([]topology.Node{{ID: rec.GetId(), Region: rec.GetRegion(), Addr: rec.GetAddr()}})
	slog.Info("node joined", "node", rec.GetId(), "region", rec.GetRegion(), "addr", rec.GetAddr())
	return &nodepb.JoinResponse{Topology: data}, nil
}
