package node_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	pb "github.com/terroir-db/terroir/internal/rangeserver/rangepb"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// commitLog records when each successful commit of one region completed.
type commitLog struct {
	mu     sync.Mutex
	done   []time.Time
	failed int
}

func (l *commitLog) add(at time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failed++
		return
	}
	l.done = append(l.done, at)
}

// counts returns how many commits and failed operations the log holds.
func (l *commitLog) counts() (commits, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done), l.failed
}

// longestGap returns the longest time in [from, to) without a commit
// completing, counting from `from`.
func (l *commitLog) longestGap(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var gap time.Duration
	last := from
	for _, at := range l.done {
		if at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		gap = max(gap, at.Sub(last))
		last = at
	}
	return max(gap, to.Sub(last))
}

// A range leader frozen with SIGSTOP (its sockets stay open, nothing
// answers) under load in two data regions: both regions commit again
// within 2 s of the freeze (DESIGN.md §12: failure detection does not wait
// for deadlines). The load's operations have a 10 s deadline; before the
// failure detector, every one sent to the frozen leader failed at it.
func TestFrozenRangeLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node processes")
	}
	addrs := freeAddrs(t, 6)
	yaml := "regions: [east, west]\nrtt:\n  - {between: [east, west], ms: 20}\nnodes:\n"
	for i, a := range addrs {
		region := "east"
		if i >= 3 {
			region = "west"
		}
		yaml += fmt.Sprintf("  - {id: %d, region: %s, addr: %q}\n", i+1, region, a)
	}
	// The global epoch service on the east nodes: freezing an east node may
	// stall it too, which the west region then feels.
	yaml += `groups:
  - {id: 1, kind: global-epoch, region: east, replicas: [1, 2, 3]}
  - {id: 11, kind: local-epoch, region: east, replicas: [1, 2, 3]}
  - {id: 12, kind: txn-state, region: east, replicas: [1, 2, 3]}
  - {id: 13, kind: publisher, region: east, replicas: [1, 2, 3]}
  - {id: 14, kind: directory, region: east, replicas: [1, 2, 3]}
  - {id: 21, kind: local-epoch, region: west, replicas: [4, 5, 6]}
  - {id: 22, kind: txn-state, region: west, replicas: [4, 5, 6]}
  - {id: 23, kind: publisher, region: west, replicas: [4, 5, 6]}
  - {id: 24, kind: directory, region: west, replicas: [4, 5, 6]}
  - {id: 100, kind: range, region: east, start: "", end: "m", replicas: [1, 2, 3]}
  - {id: 200, kind: range, region: west, start: "m", replicas: [4, 5, 6]}
split_size: off
split_qps: off
`
	top, err := topology.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	topPath := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(topPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &procCluster{t: t, topPath: topPath, dir: dir, procs: map[uint64]*exec.Cmd{}}
	for id := uint64(1); id <= 6; id++ {
		p.start(id)
	}
	t.Cleanup(func() {
		for id := range p.procs {
			_ = p.procs[id].Process.Signal(syscall.SIGCONT)
			p.kill(id)
		}
	})

	dbs := map[string]*client.DB{}
	for _, region := range []string{"east", "west"} {
		db, err := client.Open(topPath, client.Options{Region: region, Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs[region] = db
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	put := func(ctx context.Context, db *client.DB, key string) error {
		octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
		defer ocancel()
		return db.Update(octx, func(ctx context.Context, tx *client.Txn) error {
			return tx.Put(ctx, []byte(key), []byte("v"))
		})
	}
	// Both regions commit before anything is frozen.
	for region, key := range map[string]string{"east": "a", "west": "x"} {
		for put(ctx, dbs[region], key) != nil {
			if ctx.Err() != nil {
				t.Fatalf("%s never committed", region)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	logs := map[string]*commitLog{"east": {}, "west": {}}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for region, prefix := range map[string]string{"east": "a", "west": "x"} {
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; lctx.Err() == nil; i++ {
					err := put(lctx, dbs[region], fmt.Sprintf("%s%d-%d", prefix, w, i%50))
					if lctx.Err() == nil {
						logs[region].add(time.Now(), err)
					}
				}
			}()
		}
	}
	defer func() { stopLoad(); wg.Wait() }()
	time.Sleep(2 * time.Second)

	// A round can miss the bound on a machine starved by other work (CI
	// runs test packages side by side on two cores, and these nodes are
	// race-instrumented test binaries): the property is that failover does
	// not wait for deadlines, which would show as a gap of the load's 10 s
	// deadline in every round. So up to three rounds are tried, each logged,
	// and the test passes on the first in which both regions held the bound.
	const rounds = 3
	for round := 1; ; round++ {
		holder := leaseHolder(ctx, t, top, 100)
		t.Logf("round %d: freezing node %d, holder of range 100's lease", round, holder)
		frozeAt := time.Now()
		if err := p.procs[holder].Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		thawAt := time.Now()
		if err := p.procs[holder].Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)

		var missed []string
		for _, region := range []string{"east", "west"} {
			l := logs[region]
			gap := l.longestGap(frozeAt, thawAt)
			commits, failed := l.counts()
			t.Logf("round %d, %s: longest time without a commit while node %d was frozen: %v (%d commits, %d failed operations so far)",
				round, region, holder, gap.Round(time.Millisecond), commits, failed)
			if gap > 2*time.Second {
				missed = append(missed, fmt.Sprintf("%s went %v without a commit", region, gap.Round(time.Millisecond)))
			}
			if l.longestGap(thawAt, thawAt.Add(2*time.Second)) > 2*time.Second {
				t.Fatalf("round %d: %s did not commit in the 2 s after the frozen node resumed", round, region)
			}
		}
		if len(missed) == 0 {
			return
		}
		if round == rounds {
			t.Fatalf("in each of %d rounds a region went over 2 s without a commit while a range leader was frozen; the last: %v", rounds, missed)
		}
	}
}

// leaseHolder returns the node holding range id's lease, asking every node
// until one names a holder whose lease is current.
func leaseHolder(ctx context.Context, t *testing.T, top *topology.Topology, id uint64) uint64 {
	t.Helper()
	d := transport.NewDialer(transport.NewNetwork(top), transport.Endpoint{Region: top.Regions[0]}, nil)
	defer d.Close()
	for ctx.Err() == nil {
		for _, n := range top.Nodes {
			conn, err := d.Conn(n.ID)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := pb.NewRangeClient(conn).Ranges(ctx, &pb.RangesRequest{})
			if err != nil {
				continue
			}
			if i := slices.IndexFunc(resp.GetRanges(), func(r *pb.RangeStatus) bool {
				return r.GetRangeDescriptor().GetRangeId() == id && r.GetLeader()
			}); i >= 0 {
				return n.ID
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no node serves range %d", id)
	return 0
}
