package directory

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/terroir-db/terroir/internal/directory/directorypb"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// Client calls one region's directory group. Every call retries other
// replicas and transient failures until ctx ends (transport.ErrNoLeader).
type Client struct {
	group uint64
	lc    *transport.LeaderClient
}

// NewClient returns a client of directory group `group`, whose replicas
// are on the given nodes.
func NewClient(dialer *transport.Dialer, g topology.Group) *Client {
	return &Client{group: g.ID, lc: transport.NewGroupClient(dialer, g)}
}

// Lookup returns the descriptor of the range holding key and up to limit-1
// after it (none if no range of the region holds key now).
func (c *Client) Lookup(ctx context.Context, key []byte, limit int) ([]*pb.RangeDescriptor, error) {
	var out []*pb.RangeDescriptor
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).Lookup(ctx, &directorypb.LookupRequest{GroupId: c.group, Key: key, Limit: uint32(limit)})
		out = resp.GetDescriptors()
		return err
	})
	return out, err
}

// Update installs descriptors (a split's two halves, a merge's result and
// the subsumed range, a leader's reconciliation) and returns how many
// changed the directory. Errors: InvalidArgument for a malformed
// descriptor or one of another region.
func (c *Client) Update(ctx context.Context, descs ...*pb.RangeDescriptor) (int, error) {
	var n int
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).Update(ctx, &directorypb.UpdateRequest{GroupId: c.group, Descriptors: descs})
		n = int(resp.GetInstalled())
		return err
	})
	return n, err
}

// Allocate returns a range ID that no range of the cluster ever had.
func (c *Client) Allocate(ctx context.Context) (uint64, error) {
	var id uint64
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).Allocate(ctx, &directorypb.AllocateRequest{GroupId: c.group})
		id = resp.GetRangeId()
		return err
	})
	return id, err
}

// Placements returns the placement map, by start key.
func (c *Client) Placements(ctx context.Context) ([]*directorypb.Placement, error) {
	var out []*directorypb.Placement
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).Placement(ctx, &directorypb.PlacementRequest{GroupId: c.group})
		out = resp.GetPlacements()
		return err
	})
	return out, err
}

// List returns every descriptor of the region, by start key.
func (c *Client) List(ctx context.Context) ([]*pb.RangeDescriptor, error) {
	var out []*pb.RangeDescriptor
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).List(ctx, &directorypb.ListRequest{GroupId: c.group})
		out = resp.GetDescriptors()
		return err
	})
	return out, err
}

// GCPolicy returns the region's gc_ttl set at run time (0: the topology
// file's) and its protections with their status as the serving replica
// sees them.
func (c *Client) GCPolicy(ctx context.Context) (*directorypb.GCPolicyResponse, error) {
	var out *directorypb.GCPolicyResponse
	err := c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		resp, err := directorypb.NewDirectoryClient(conn).GCPolicy(ctx, &directorypb.GCPolicyRequest{GroupId: c.group})
		out = resp
		return err
	})
	return out, err
}

// SetGCTTL sets the region's gc_ttl (0: back to the topology file's).
// Errors: InvalidArgument (ErrBadGCTTL) out of bounds.
func (c *Client) SetGCTTL(ctx context.Context, ttl time.Duration) error {
	return c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := directorypb.NewDirectoryClient(conn).SetGCTTL(ctx, &directorypb.SetGCTTLRequest{GroupId: c.group, GcTtlMs: uint64(ttl.Milliseconds())})
		return err
	})
}

// Protect registers or renews p. Errors: InvalidArgument
// (ErrBadProtection) for a protection without an id or with a ttl out of
// bounds.
func (c *Client) Protect(ctx context.Context, p *directorypb.Protection) error {
	return c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := directorypb.NewDirectoryClient(conn).Protect(ctx, &directorypb.ProtectRequest{GroupId: c.group, Protection: p})
		return err
	})
}

// Release drops the protection id (none: no error).
func (c *Client) Release(ctx context.Context, id string) error {
	return c.lc.Call(ctx, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		_, err := directorypb.NewDirectoryClient(conn).Release(ctx, &directorypb.ReleaseRequest{GroupId: c.group, Id: id})
		return err
	})
}

// Directories holds a client of every region's directory, as the topology
// names the groups.
type Directories struct {
	byRegion map[string]*Client
	regions  []string // those with a directory, as the topology lists them
}

// NewDirectories returns clients of every directory group of top.
func NewDirectories(top *topology.Topology, dialer *transport.Dialer) *Directories {
	d := &Directories{byRegion: map[string]*Client{}}
	for _, r := range top.Regions {
		if g := top.GroupsOfKind(topology.KindDirectory, r); len(g) > 0 {
			d.byRegion[r] = NewClient(dialer, g[0])
			d.regions = append(d.regions, r)
		}
	}
	return d
}

// Of returns the client of region's directory, or nil if it has none.
func (d *Directories) Of(region string) *Client { return d.byRegion[region] }

// Regions returns the regions with a directory, as the topology lists them.
func (d *Directories) Regions() []string { return d.regions }
