package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/node"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
)

func startCmd() *cobra.Command {
	var configPath, dataDir, metricsAddr, certsDir string
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
			n, err := node.Start(node.Config{Topology: top, NodeID: nodeID, DataDir: dataDir, OrphanAfter: orphanAfter, Certs: certs, Insecure: insecure})
			if err != nil {
				return err
			}
			slog.Warn("node serving", "node", nodeID, "addr", n.Addr(), "data-dir", dataDir)
			var srv *http.Server
			if metricsAddr != "" {
				mux := http.NewServeMux()
				mux.Handle("/metrics", promhttp.HandlerFor(n.Registry(), promhttp.HandlerOpts{}))
				srv = &http.Server{Addr: metricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
				go func() {
					if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
						slog.Error("metrics server", "err", err)
					}
				}()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			if srv != nil {
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = srv.Shutdown(sctx)
				cancel()
			}
			return n.Close()
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "topology file (YAML)")
	cmd.Flags().Uint64Var(&nodeID, "node", 0, "this node's ID in the topology")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for the node's Pebble store")
	cmd.Flags().StringVar(&certsDir, "certs-dir", "certs", "directory of ca.crt, node.crt and node.key (reloaded when they change)")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "serve plaintext with no authentication: any process that reaches the port may do anything")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this host:port (off if empty)")
	cmd.Flags().DurationVar(&orphanAfter, "orphan-after", 0,
		"how long this node's range leaders let a transaction hold locks without a heartbeat from its coordinator (0: the topology's orphan_after, default 2s)")
	_ = cmd.MarkFlagRequired("config")
	_ = cmd.MarkFlagRequired("node")
	return cmd
}
