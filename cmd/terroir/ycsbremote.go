package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// remoteSample is what a running cluster's nodes had served at one moment,
// read from their /metrics: the RPCs by method, summed over the nodes, and
// the Raft groups each node's replicas led (terroir_raft_leaders), by node
// HTTP address. It makes a run against separate node processes explain
// itself as the embedded cluster's does (runCost): which layout of leaders
// it had, and what each operation cost in RPCs (issue 17).
type remoteSample struct {
	byMethod map[string]float64
	leaders  map[string]float64
}

// sampleRemote reads /metrics from each of httpAddrs (host:port,
// scrapeMetrics); a node that does not answer, or answers what does not
// parse, is left out of the sample.
func sampleRemote(ctx context.Context, httpAddrs []string) remoteSample {
	out := remoteSample{byMethod: map[string]float64{}, leaders: map[string]float64{}}
	for _, addr := range httpAddrs {
		mfs, err := scrapeMetrics(ctx, addr)
		if err != nil {
			continue
		}
		if mf := mfs["terroir_rpc_server_seconds"]; mf != nil {
			addRPCsByMethod(mf, out.byMethod)
		}
		if mf := mfs["terroir_raft_leaders"]; mf != nil && len(mf.GetMetric()) == 1 {
			out.leaders[addr] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return out
}

// scrapeMetrics GETs a node's /metrics at httpAddr (host:port), within 2
// s, and parses it. Errors: the request's, or the text format's.
func scrapeMetrics(ctx context.Context, httpAddr string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// printRemote prints what a run of ops operations cost the nodes between two
// samples, and the groups each node led at its end.
func printRemote(before, after remoteSample, ops int64) {
	if ops <= 0 || len(after.leaders) == 0 {
		return // no node answered
	}
	printRPCsByMethod(before.byMethod, after.byMethod, ops)
	addrs := make([]string, 0, len(after.leaders))
	for a := range after.leaders {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	var led []string
	for _, a := range addrs {
		led = append(led, fmt.Sprintf("%s %.0f", a, after.leaders[a]))
	}
	fmt.Printf("Raft groups led at the end, by node: %s\n", strings.Join(led, ", "))
}
