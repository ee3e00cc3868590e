package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/node"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
)

func startCmd() *cobra.Command {
	var configPath, dataDir, httpAddr, certsDir string
	var insecure bool
	var nodeID uint64
	var orphanAfter time.Duration
	cmd := &cobra.Command{
		Use:   "start --config <topology.yaml> --node <id> --data-dir <dir>",
		Short: "Run one node: host its replicas of every group the topology places on it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			top, err := topology.Load(configPath)
			if err != nil {
				return err
			}
			if _, ok := top.Node(nodeID); !ok {
				return fmt.Errorf("--node %d is not in %s", nodeID, configPath)
			}
			if dataDir == "" {
				return errors.New("--data-dir is required")
			}
			if orphanAfter != 0 && orphanAfter < top.OrphanAfter/2 {
				// Coordinators heartbeat every orphan_after/4 of the topology.
				return fmt.Errorf("--orphan-after %v: must be at least half the topology's orphan_after (%v), or 0 for it", orphanAfter, top.OrphanAfter)
			}
			var certs *security.Certs
			if !insecure {
				if certs, err = security.LoadNode(certsDir); err != nil {
					return fmt.Errorf("%w\n  create them with `terroir cert create-ca` and `terroir cert create-node %d <region>`, point --certs-dir at them, or pass --insecure for a plaintext cluster", err, nodeID)
				}
			}
			if httpAddr == "" {
				self, _ := top.Node(nodeID)
				if httpAddr, err = defaultHTTPAddr(self.Addr); err != nil {
					return err
				}
			}
			n, err := node.Start(node.Config{Topology: top, NodeID: nodeID, DataDir: dataDir, OrphanAfter: orphanAfter,
				Certs: certs, Insecure: insecure, HTTPAddr: httpAddr})
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
	cmd.Flags().Uint64Var(&nodeID, "node", 0, "this node's ID in the topology")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for the node's Pebble store")
	cmd.Flags().StringVar(&certsDir, "certs-dir", "certs", "directory of ca.crt, node.crt and node.key (reloaded when they change)")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "serve plaintext with no authentication: any process that reaches the port may do anything")
	cmd.Flags().StringVar(&httpAddr, "http-addr", "", "serve /metrics, /healthz, /readyz and the web console on this host:port (default: 127.0.0.1 at the node's RPC port + 1000; the console shows range boundaries, so expose it only to operators)")
	cmd.Flags().DurationVar(&orphanAfter, "orphan-after", 0,
		"how long this node's range leaders let a transaction hold locks without a heartbeat from its coordinator (0: the topology's orphan_after, default 2s)")
	_ = cmd.MarkFlagRequired("config")
	_ = cmd.MarkFlagRequired("node")
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
