package node_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/localcluster"
	"github.com/terroir-db/terroir/internal/node"
	"github.com/terroir-db/terroir/internal/storage"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// TestMain doubles as a node process: with TERROIR_TEST_NODE set, the test binary
// runs one node until it is killed, so tests can kill it abruptly (SIGKILL).
func TestMain(m *testing.M) {
	if id := os.Getenv("TERROIR_TEST_NODE"); id != "" {
		runNodeProcess(id)
		return
	}
	goleak.VerifyTestMain(m)
}

func runNodeProcess(idStr string) {
	id, _ := strconv.ParseUint(idStr, 10, 64)
	top, err := topology.Load(os.Getenv("TERROIR_TEST_TOPOLOGY"))
	if err == nil {
		_, err = node.Start(node.Config{Topology: top, NodeID: id, DataDir: os.Getenv("TERROIR_TEST_DIR"), Insecure: true})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	time.Sleep(10 * time.Minute) // until killed; bounded in case the test dies
	os.Exit(0)
}

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	var ls []net.Listener
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return addrs
}

type procCluster struct {
	t       *testing.T
	topPath string
	dir     string
	procs   map[uint64]*exec.Cmd
}

func (p *procCluster) start(id uint64) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"TERROIR_TEST_NODE="+strconv.FormatUint(id, 10),
		"TERROIR_TEST_TOPOLOGY="+p.topPath,
		"TERROIR_TEST_DIR="+filepath.Join(p.dir, fmt.Sprint(id)))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.procs[id] = cmd
}

// kill sends SIGKILL: no graceful close, no flush.
func (p *procCluster) kill(id uint64) {
	cmd := p.procs[id]
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	delete(p.procs, id)
}

func TestCrashRestartKeepsEpoch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node processes")
	}
	addrs := freeAddrs(t, 3)
	yaml := "regions: [r1]\nnodes:\n"
	for i, a := range addrs {
		yaml += fmt.Sprintf("  - {id: %d, region: r1, addr: %q}\n", i+1, a)
	}
	yaml += "groups:\n  - {id: 1, kind: local-epoch, region: r1}\n"
	top, err := topology.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	p := &procCluster{t: t, topPath: filepath.Join(t.TempDir(), "top.yaml"), dir: t.TempDir(), procs: map[uint64]*exec.Cmd{}}
	if err := os.WriteFile(p.topPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		p.start(id)
	}
	t.Cleanup(func() {
		for id := range p.procs {
			p.kill(id)
		}
	})

	dialer := transport.NewDialer(transport.NewNetwork(top), transport.Endpoint{Region: "r1"}, nil)
	defer dialer.Close()
	reader := epoch.NewReader(dialer, topology.Group{ID: 1, Kind: topology.KindLocalEpoch, Region: "r1", Replicas: []uint64{1, 2, 3}})
	defer reader.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	readUntil := func(min uint64) uint64 {
		for {
			e, err := reader.Read(ctx)
			if err == nil && e >= min {
				return e
			}
			if ctx.Err() != nil {
				t.Fatalf("epoch did not reach %d: %v", min, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	before := readUntil(30)

	// Kill every node at once: the epoch can only come back from disk.
	for id := uint64(1); id <= 3; id++ {
		p.kill(id)
	}
	for id := uint64(1); id <= 3; id++ {
		p.start(id)
	}
	after := readUntil(0)
	if after < before {
		t.Fatalf("epoch went back from %d to %d across a crash of every node", before, after)
	}
	// Each restarted replica, once it serves, serves at least what was read before.
	for id := uint64(1); id <= 3; id++ {
		conn, _ := dialer.Conn(id)
		for {
			resp, err := epochpb.NewEpochClient(conn).ReadEpoch(ctx, &epochpb.ReadEpochRequest{GroupId: 1})
			if err == nil {
				if resp.GetEpoch() < before {
					t.Fatalf("replica %d serves epoch %d after restart, below %d read before the crash", id, resp.GetEpoch(), before)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("replica %d never served after restart: %v", id, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// And the group still advances.
	readUntil(after + 20)
	t.Logf("epoch %d before the crash, %d after restart", before, after)
}

func TestCorruptDataDirIsAnError(t *testing.T) {
	c := localcluster.StartT(t, "../../examples/one-region.yaml", localcluster.Options{})
	if err := c.StopNode(2); err != nil {
		t.Fatal(err)
	}
	manifests, _ := filepath.Glob(filepath.Join(c.DataDir(), "node-2", "MANIFEST-*"))
	if len(manifests) == 0 {
		t.Fatal("no MANIFEST in node 2's directory")
	}
	m := manifests[len(manifests)-1]
	data, _ := os.ReadFile(m)
	data[10] ^= 0xff
	if err := os.WriteFile(m, data, 0o644); err != nil {
		t.Fatal(err)
	}
	err := c.RestartNode(2)
	if !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("restart on a corrupt MANIFEST = %v, want storage.ErrCorrupt", err)
	}
	t.Logf("restart refused: %v", err)
}

func TestWrongNodeDataDir(t *testing.T) {
	top, err := topology.Load("../../examples/one-region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e, err := storage.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	_, err = node.Start(node.Config{Topology: top, NodeID: 2, DataDir: dir, Insecure: true})
	if !errors.Is(err, storage.ErrWrongNode) {
		t.Fatalf("starting node 2 on node 1's directory = %v, want storage.ErrWrongNode", err)
	}
}
