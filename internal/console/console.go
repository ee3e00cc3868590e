// Package console is the web console every node serves (issue 13): regions
// and nodes with liveness, the local and global epochs advancing, ranges
// with leaders and leases, Raft groups with replica lag, and latency charts
// fed by the node's own Prometheus histograms. Static files are embedded;
// the page polls two JSON endpoints:
//
//	/api/status   the cluster as admin.Status reports it, plus the serving node
//	/api/latency  P50/P99 and rate per second of the node's commits and reads, last 5 min
package console

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/terroir-db/terroir/internal/admin"
)

//go:embed assets
var assets embed.FS

// Self names the node serving the console.
type Self struct {
	ID      uint64 `json:"id"`
	Region  string `json:"region"`
	Version string `json:"version"`
}

// StatusFunc gathers the cluster's status (admin.Status through the node's
// dialer).
type StatusFunc func(ctx context.Context) (*admin.ClusterStatus, error)

// statusTimeout bounds gathering one status report; statusTTL is how long a
// report is served again, so any number of open pages cost the cluster one
// report per statusTTL at most.
const (
	statusTimeout = 3 * time.Second
	statusTTL     = 500 * time.Millisecond
)

// Console serves the console of one node. It samples the node's
// histograms every second from the first request for them on (an idle node
// pays nothing); Close stops it.
type Console struct {
	self   Self
	status StatusFunc
	series *sampler

	mu       sync.Mutex
	cached   []byte
	cachedAt time.Time
}

// New returns the console of node self, reporting status and charting the
// histograms of g.
func New(self Self, status StatusFunc, g prometheus.Gatherer) *Console {
	return &Console{self: self, status: status, series: newSampler(g)}
}

// Close stops the sampler and waits for it.
func (c *Console) Close() { c.series.close() }

// Handler serves the page, its files and the two JSON endpoints.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	files, _ := fs.Sub(assets, "assets")
	mux.Handle("GET /", http.FileServerFS(files))
	mux.HandleFunc("GET /api/status", c.serveStatus)
	mux.HandleFunc("GET /api/latency", func(w http.ResponseWriter, _ *http.Request) {
		c.series.start()
		writeJSON(w, map[string]any{"series": c.series.snapshot()})
	})
	return mux
}

func (c *Console) serveStatus(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cached == nil || time.Since(c.cachedAt) > statusTTL {
		ctx, cancel := context.WithTimeout(r.Context(), statusTimeout)
		st, err := c.status(ctx)
		cancel()
		if err != nil {
			http.Error(w, "status: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		body, err := json.Marshal(struct {
			Node Self `json:"node"`
			*admin.ClusterStatus
		}{c.self, st})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		c.cached, c.cachedAt = body, time.Now()
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(c.cached)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
