package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/node"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
)

func startCmd() *cobra.Command {
	var configPath, dataDir, httpAddr, certsDir, join, region, addr, cacheFlag string
	var insecure, pprofOn bool
	var nodeID uint64
	var orphanAfter time.Duration
	cmd := &cobra.Command{
		Use:   "start (--config <topology.yaml> | --join <host:port>[,...] --region <r> --addr <host:port>) --node <id> --data-dir <dir>",
		Short: "Run one node: host its replicas of every group the topology places on it, or join a running cluster",
		Long: "start runs a node of the topology file (--config), or one that is not in it (--join): it\n" +
			"registers with its region through any of the named nodes, gets the cluster's topology\n" +
			"(kept in its data directory) and receives replicas as the cluster moves them to it.\n" +
			"With certificates, --node and --region default to what the node certificate names.\n" +
			"--addr with --config restarts a node of the file at a new address; the registry records it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir == "" {
				return errors.New("--data-dir is required")
			}
			if (configPath == "") == (join == "") {
				return errors.New("give either --config (a node of the topology file) or --join (a node that joins a running cluster)")
			}
			var top *topology.Topology
			var err error
			if configPath != "" { // the file is vetted first
				if top, err = topology.Load(configPath); err != nil {
					return err
				}
				if _, ok := top.Node(nodeID); nodeID != 0 && !ok {
					return fmt.Errorf("--node %d is not in %s (a node that is not joins with --join)", nodeID, configPath)
				}
			}
			var certs *security.Certs
			if !insecure {
				if certs, err = security.LoadNode(certsDir); err != nil {
					return fmt.Errorf("%w\n  create them with `terroir cert create-ca` and `terroir cert create-node %d <region>`, point --certs-dir at them, or pass --insecure for a plaintext cluster", err, nodeID)
				}
				id := certs.Identity()
				nodeID, region = cmp.Or(nodeID, id.Node), cmp.Or(region, id.Region)
			}
			if nodeID == 0 {
				return errors.New("--node is required")
			}
			if addr != "" {
				if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
					return fmt.Errorf("--addr %q is not host:port", addr)
				}
			}
			if join != "" {
				if region == "" || addr == "" {
					return errors.New("--join needs --region and --addr (this node's RPC address)")
				}
				if top, err = node.Join(cmd.Context(), node.JoinConfig{Peers: strings.Split(join, ","), NodeID: nodeID, Region: region,
					Addr: addr, DataDir: dataDir, Certs: certs, Insecure: insecure}); err != nil {
					return err
				}
			} else {
				if _, ok := top.Node(nodeID); !ok {
					return fmt.Errorf("--node %d is not in %s (a node that is not joins with --join)", nodeID, configPath)
				}

			}
			if orphanAfter != 0 && orphanAfter < top.OrphanAfter/2 {
				// Coordinators heartbeat every orphan_after/4 of the topology.
				return fmt.Errorf("--orphan-after %v: must be at least half the topology's orphan_after (%v), or 0 for it", orphanAfter, top.OrphanAfter)
			}
			if httpAddr == "" {
				self, _ := top.Node(nodeID)
				if httpAddr, err = defaultHTTPAddr(cmp.Or(addr, self.Addr)); err != nil {
					return err
				}
			}
			var cacheSize uint64
			if cacheFlag != "" {
				if cacheSize, err = topology.ParseSize(cacheFlag); err != nil {
					return fmt.Errorf("--cache %q: %w", cacheFlag, err)
				}
			}
			n, err := node.Start(node.Config{CacheSize: int64(cacheSize), Topology: top, NodeID: nodeID, DataDir: dataDir, OrphanAfter: orphanAfter,
				Certs: certs, Insecure: insecure, HTTPAddr: httpAddr, Pprof: pprofOn, Addr: addr})
			if err != nil {
				return err
			}
			slog.Warn("node serving", "node", nodeID, "addr", n.Addr(), "console and metrics", "http://"+n.HTTPAddr()+"/", "data-dir", dataDir)
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			return n.Close()
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "topology file (YAML)")
	cmd.Flags().StringVar(&join, "join", "", "comma-separated host:port of running nodes: join the cluster instead of reading a topology file")
	cmd.Flags().StringVar(&region, "region", "", "the joining node's region (default: its certificate's)")
	cmd.Flags().StringVar(&addr, "addr", "", "this node's RPC address, host:port (required with --join; with --config, a new address for the file's node)")
	cmd.Flags().Uint64Var(&nodeID, "node", 0, "this node's ID (default: its certificate's)")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for the node's Pebble store")
	cmd.Flags().StringVar(&certsDir, "certs-dir", "certs", "directory of ca.crt, node.crt and node.key (reloaded when they change)")
	cmd.Flags().StringVar(&cacheFlag, "cache", "", "memory for the store's block cache (uncompressed data blocks) and memtables, e.g. 512MiB (default 256MiB, at least 8MiB); an eighth more holds the newest versions of the keys read lately")
	cmd.Flags().BoolVar(&pprofOn, "pprof", false, "also serve Go's profiles under /debug/pprof/ on --http-addr (CPU, heap, goroutines), to diagnose a slow node; unauthenticated, like the rest of that address")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "serve plaintext with no authentication: any process that reaches the port may do anything")
	cmd.Flags().StringVar(&httpAddr, "http-addr", "", "serve /metrics, /healthz, /readyz and the web console on this host:port (default: 127.0.0.1 at the node's RPC port + 1000; the console shows range boundaries, so expose it only to operators)")
	cmd.Flags().DurationVar(&orphanAfter, "orphan-after", 0,
		"how long this node's range leaders let a transaction hold locks without a heartbeat from its coordinator (0: the topology's orphan_after, default 2s)")
	return cmd
}

// defaultHTTPAddr is a node's HTTP address when --http-addr is not given:
// loopback, at its RPC port + 1000 (7101 → 8101). The console shows range
// boundaries (keys), so reaching it from elsewhere is the operator's choice.
func defaultHTTPAddr(rpcAddr string) (string, error) {
	_, port, err := net.SplitHostPort(rpcAddr)
	if err != nil {
		return "", fmt.Errorf("the node's address %q: %w", rpcAddr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p+1000 > 65535 {
		return "", fmt.Errorf("the node's address %q has no port 1000 below 65536: give --http-addr", rpcAddr)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1000)), nil
}
