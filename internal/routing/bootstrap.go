package routing

import (
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
)

// BootstrapGeneration is the generation of a range the topology file seeds.
const BootstrapGeneration = 1

// BootstrapDescriptor returns the first descriptor of range g of the
// topology file (DESIGN.md §11: the file seeds the descriptors once). Its
// start is sticky: the operator chose the boundary, so automatic merges
// keep it.
func BootstrapDescriptor(g topology.Group) *pb.RangeDescriptor {
	return &pb.RangeDescriptor{RangeId: g.ID, StartKey: g.Start, EndKey: g.End, Region: g.Region,
		Replicas: append([]uint64(nil), g.Replicas...), Generation: BootstrapGeneration, Sticky: true}
}
