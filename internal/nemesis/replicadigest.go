package nemesis

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/terroir-db/terroir/internal/rangeserver"
)

// replicaCheckBound is how long the replica check waits for the replicas
// of one range to catch up with its newest shape and close a common epoch.
const replicaCheckBound = 20 * time.Second

// checkReplicas compares, once the load has stopped, the data every
// running replica of every range (voters and non-voters) holds as of an
// epoch they have all closed (rangeserver.DataDigest): they must agree. A
// replica that lost or never received data, such as one that applied a
// merge without the subsumed range's keys, differs even where no read of
// the workloads reached it.
func (cp *campaign) checkReplicas() {
	ids := map[uint64]bool{}
	for _, nid := range cp.c.NodeIDs() {
		if n := cp.c.Node(nid); n != nil {
			for _, rid := range n.RangeIDs() {
				ids[rid] = true
			}
		}
	}
	sorted := make([]uint64, 0, len(ids))
	for rid := range ids {
		sorted = append(sorted, rid)
	}
	slices.Sort(sorted)
	for _, rid := range sorted {
		deadline := time.Now().Add(replicaCheckBound)
		for {
			agree, differ, err := cp.compareReplicas(rid)
			switch {
			case differ != "":
				cp.anomaly("range %d: its replicas hold different data: %s", rid, differ)
			case err == nil:
				if agree > 1 {
					cp.count("range replicas compared: data digests agree")
				}
			case time.Now().After(deadline):
				cp.anomaly("range %d: its replicas could not be compared within %v: %v", rid, replicaCheckBound, err)
			default:
				time.Sleep(50 * time.Millisecond)
				continue
			}
			break
		}
	}
}

// compareReplicas digests range rid's data on each running replica its
// newest descriptor names, as of the lowest epoch they have closed, and
// returns how many agree, or what differs; err if they cannot be compared
// yet (a replica behind on the range's shape or on closing the epoch).
func (cp *campaign) compareReplicas(rid uint64) (agree int, differ string, err error) {
	var reps []*rangeserver.Replica
	var nodes []uint64
	newest := cp.rangeByID(rid)
	if newest == nil || newest.GetSubsumed() {
		return 0, "", nil // gone or merged away: nothing to compare
	}
	var epoch uint64
	for _, nid := range append(slices.Clone(newest.GetReplicas()), newest.GetNonVoters()...) {
		n := cp.c.Node(nid)
		if n == nil {
			continue // not running: it is compared once it is
		}
		r := n.Range(rid)
		if r == nil || r.Desc().GetGeneration() != newest.GetGeneration() {
			return 0, "", fmt.Errorf("node %d's replica is not at generation %d yet", nid, newest.GetGeneration())
		}
		if c, _ := r.ClosedEpoch(nil, nil); len(reps) == 0 || c < epoch {
			epoch = c
		}
		reps, nodes = append(reps, r), append(nodes, nid)
	}
	type digest struct {
		sum  uint64
		keys int
	}
	var got []digest
	for _, r := range reps {
		sum, keys, gen, err := r.DataDigest(epoch)
		switch {
		case errors.Is(err, rangeserver.ErrDigestNotReady):
			return 0, "", err
		case err != nil:
			return 0, fmt.Sprintf("digesting: %v", err), nil
		case gen != newest.GetGeneration():
			return 0, "", fmt.Errorf("a replica changed generation while digested")
		}
		got = append(got, digest{sum, keys})
	}
	for _, g := range got[1:] {
		if g != got[0] {
			var parts []string
			for i, g := range got {
				parts = append(parts, fmt.Sprintf("node %d: %d keys, digest %016x", nodes[i], g.keys, g.sum))
			}
			return 0, fmt.Sprintf("as of epoch %d (generation %d): %s", epoch, newest.GetGeneration(), strings.Join(parts, "; ")), nil
		}
	}
	return len(got), "", nil
}
