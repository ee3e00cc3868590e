package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// benchRegion is the region of the benchmarks that run nodes as processes.
const benchRegion = "us-east1"

// procCluster runs a one-region cluster's nodes as `terroir start`
// processes (plaintext, on free 127.0.0.1 ports), for benchmarks that
// measure one node's own resources or add nodes with --join. Nodes 1–3 are
// the topology file's; later ids join.
type procCluster struct {
	dir, path, exe string
	top            *topology.Topology
	nodes          map[uint64]*benchNode
	size           int      // how many nodes it may run
	addrs          []string // size RPC then size HTTP addresses
}

// benchNode is one node process.
type benchNode struct {
	id         uint64
	addr, http string
	cmd        *exec.Cmd
	done       chan struct{} // closed once the process exited
}

// newProcCluster returns a cluster of at most size nodes whose topology
// file is what yaml makes of the first three nodes' RPC addresses.
func newProcCluster(name string, size int, yaml func(addrs []string) string) (*procCluster, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "terroir-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	p := &procCluster{dir: dir, exe: exe, nodes: map[uint64]*benchNode{}, size: size}
	if p.addrs, err = freeLoopbackAddrs(2 * size); err != nil {
		return nil, err
	}
	text := yaml(p.addrs)
	if p.top, err = topology.Parse([]byte(text)); err != nil {
		return nil, err
	}
	p.path = filepath.Join(dir, "topology.yaml")
	return p, os.WriteFile(p.path, []byte(text), 0o644)
}

// freeLoopbackAddrs returns n 127.0.0.1 addresses whose ports were free.
func freeLoopbackAddrs(n int) ([]string, error) {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		out = append(out, l.Addr().String())
		defer l.Close()
	}
	return out, nil
}

// start runs node id as a process, of the file or joining through node 1,
// and returns once it serves /healthz (at most 30 s).
func (p *procCluster) start(id uint64, join bool) error {
	n := &benchNode{id: id, addr: p.addrs[id-1], http: p.addrs[p.size+int(id)-1], done: make(chan struct{})}
	args := []string{"start", "--log-level", "info", "--insecure", "--node", strconv.FormatUint(id, 10),
		"--data-dir", filepath.Join(p.dir, fmt.Sprint(id)), "--http-addr", n.http}
	if join {
		args = append(args, "--join", p.addrs[0], "--region", benchRegion, "--addr", n.addr)
	} else {
		args = append(args, "--config", p.path)
	}
	n.cmd = exec.Command(p.exe, args...)
	logPath := filepath.Join(p.dir, fmt.Sprintf("node-%d.log", id))
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	if err := n.cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	go func() { _ = n.cmd.Wait(); logf.Close(); close(n.done) }()
	p.nodes[id] = n
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + n.http + "/healthz")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-n.done:
			return fmt.Errorf("node %d exited; see %s", id, logPath)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %d did not serve within 30 s; see %s", id, logPath)
		}
	}
}

// startFile starts the file's three nodes and returns a client of the
// cluster and its dialer (the caller closes both).
func (p *procCluster) startFile() (*client.DB, *transport.Dialer, error) {
	for id := uint64(1); id <= 3; id++ {
		if err := p.start(id, false); err != nil {
			return nil, nil, err
		}
	}
	d := transport.NewDialer(transport.NewNetwork(p.top), transport.Endpoint{Region: benchRegion}, nil)
	db, err := client.OpenWithDialer(p.top, benchRegion, d)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return db, d, nil
}

// close stops every node (SIGTERM, then SIGKILL after 10 s) and removes
// the data unless keep.
func (p *procCluster) close(keep bool) {
	for _, n := range p.nodes {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, n := range p.nodes {
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	}
	if keep {
		fmt.Printf("data directories and node logs kept in %s\n", p.dir)
		return
	}
	_ = os.RemoveAll(p.dir)
}

// rss returns node id's resident set size in bytes (VmRSS), or 0.
func (p *procCluster) rss(id uint64) uint64 {
	n := p.nodes[id]
	if n == nil {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// metric sums a counter's value over the nodes' /metrics (a node that
// does not answer within 2 s counts nothing).
func (p *procCluster) metric(name string) float64 {
	var sum float64
	for _, n := range p.nodes {
		if mfs, err := scrapeMetrics(context.Background(), n.http); err == nil && mfs[name] != nil {
			sum += sumMetric(mfs[name])
		}
	}
	return sum
}

// snapshotBytes is the bytes the nodes streamed in Raft snapshots.
func (p *procCluster) snapshotBytes() uint64 {
	return uint64(p.metric("terroir_raft_snapshot_sent_bytes_total"))
}
