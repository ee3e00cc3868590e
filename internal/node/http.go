package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/console"
	"github.com/terroir-db/terroir/internal/raftgroup"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/version"
)

// httpShutdownTimeout bounds the HTTP server's graceful stop in Close.
const httpShutdownTimeout = 2 * time.Second

// serveHTTP serves the node's metrics, health, readiness, web console and,
// with Config.Pprof, Go's profiles on the HTTP listener Start bound
// (before anything else ran, so a bind failure stops the node). It is plain HTTP and read-only, with no actions,
// but the console shows range boundaries, which are keys: bind it where
// only operators reach (the default is loopback).
func (n *Node) serveHTTP() {
	self, _ := n.cfg.Topology.Node(n.cfg.NodeID)
	n.console = console.New(console.Self{ID: n.cfg.NodeID, Region: self.Region, Version: version.String()},
		func(ctx context.Context) (*admin.ClusterStatus, error) {
			return admin.Status(ctx, n.dialer, n.cfg.Topology)
		},
		n.registry)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := n.notReady(); len(why) > 0 {
			http.Error(w, "not ready: "+strings.Join(why, "; "), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if n.cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol) // pprof posts addresses
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/", n.console.Handler())
	n.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		BaseContext: func(net.Listener) context.Context { return n.stopped }} // Close ends requests in flight
	n.httpDone = make(chan struct{})
	go func() {
		defer close(n.httpDone)
		if err := n.http.Serve(n.httpListener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("http server stopped", "node", n.cfg.NodeID, "err", err)
		}
	}()
}

// HTTPAddr returns where the node serves metrics and the console ("" if it
// does not).
func (n *Node) HTTPAddr() string {
	if n.httpListener == nil {
		return ""
	}
	return n.httpListener.Addr().String()
}

// notReady says why the node should not get traffic yet: a hosted replica
// that has no leader or has not caught up with its group since it started.
func (n *Node) notReady() []string {
	var why []string
	check := func(rg *raftgroup.Group, kind topology.Kind) {
		switch st := rg.Status(); {
		case st.Leader == 0:
			why = append(why, fmt.Sprintf("group %d (%s) has no leader", st.Group, kind))
		case !st.CaughtUp:
			why = append(why, fmt.Sprintf("group %d (%s) is catching up", st.Group, kind))
		}
	}
	for _, h := range n.hostedGroups() {
		check(h.rg, h.g.Kind)
	}
	for _, g := range n.cfg.Topology.GroupsOn(n.cfg.NodeID) {
		if rg := n.Group(g.ID); rg != nil && g.Kind == topology.KindRange {
			check(rg, g.Kind)
		}
	}
	return why
}

// closeHTTP stops the HTTP server and the console's sampler.
func (n *Node) closeHTTP() {
	if n.http == nil {
		if n.httpListener != nil {
			_ = n.httpListener.Close() // Start failed before serving it
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
	defer cancel()
	if err := n.http.Shutdown(ctx); err != nil {
		_ = n.http.Close()
	}
	<-n.httpDone
	n.console.Close()
}
