package experiment

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/latency"
	"github.com/terroir-db/terroir/internal/ycsb"
)

// row is one line of the comparison with the paper.
type row struct {
	name  string
	h     *latency.Histogram
	paper string
	// ratio, if set, is the paper's figure the mean (or P50) is compared to.
	paperValue time.Duration
	paperStat  string // "mean" or "p50"
}

func (r *Result) rows() []row {
	rows := []row{
		{"global epoch interval", r.GlobalInterval, "P50 ~47 ms, P99 ~76 ms, mean < 55 ms", 47 * time.Millisecond, "p50"},
	}
	for _, s := range r.Snapshots {
		// The paper measured strong alone; another mode is set beside it.
		wait, of := "waiting for the epoch", ""
		if s.Mode != client.Strong {
			wait, of = "waiting", " (strong)"
		}
		rows = append(rows,
			row{s.Mode.String() + " snapshot: " + wait, s.Wait, "mean ~82 ms" + of, 82 * time.Millisecond, "mean"},
			row{s.Mode.String() + " snapshot: total", s.Total, "mean ~107 ms" + of, 107 * time.Millisecond, "mean"})
	}
	for i, region := range r.Regions {
		y := r.YCSB[i]
		if y == nil {
			continue
		}
		rows = append(rows,
			row{region + " read transaction", y.Latency[ycsb.OpRead], "P50 214 µs (Table 1)", 214 * time.Microsecond, "p50"},
			row{region + " write transaction", y.Latency[ycsb.OpUpdate], "P50 199 µs (Table 1)", 199 * time.Microsecond, "p50"})
	}
	return rows
}

func (rw row) ratio() float64 {
	v := rw.h.Quantile(50)
	if rw.paperStat == "mean" {
		v = rw.h.Mean()
	}
	return float64(v) / float64(rw.paperValue)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

// WriteTable prints the measured figures beside the paper's, with the ratio
// of this run's P50 (or mean, where the paper gives a mean) to the paper's.
func (r *Result) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%-40s %9s %9s %9s %7s %8s   %s\n", "measurement (ms)", "p50", "p99", "mean", "count", "×paper", "paper (§6.2.1, Table 1)")
	for _, rw := range r.rows() {
		fmt.Fprintf(w, "%-40s %9s %9s %9s %7d %7.2f×   %s\n", rw.name, ms(rw.h.Quantile(50)), ms(rw.h.Quantile(99)),
			ms(rw.h.Mean()), rw.h.Count(), rw.ratio(), rw.paper)
	}
	for i, region := range r.Regions {
		if y := r.YCSB[i]; y != nil {
			fmt.Fprintf(w, "%-40s %.0f transactions/s, %d failed, %d retried attempts\n", region+" YCSB-A", y.Throughput(),
				y.Failed[ycsb.OpRead]+y.Failed[ycsb.OpUpdate], y.Retries)
		}
	}
	r.Rounds.write(w)
	r.writeTargets(w)
	fmt.Fprintf(w, "%-40s %d\n", "snapshots failed (both modes)", r.SnapshotFails)
	if r.RTT != nil {
		fmt.Fprintf(w, "%-40s loopback round trip P50 %s ms, fsync (4 KiB) P50 %s ms\n", "floor on this machine",
			ms(r.RTT.Quantile(50)), ms(r.Fsync.Quantile(50)))
	}
	if r.DeviceOK {
		fmt.Fprintf(w, "%-40s %s\n", "disk, every process's", r.Device)
	}
}

// writeTargets prints the run's figures against issue 17's targets for
// the global epoch: the interval's P50 within the farthest publisher's
// configured RTT + 3 ms, and a strong snapshot's total P50 within one
// interval (this run's P50) + that RTT + 10 ms, in each strong mode.
func (r *Result) writeTargets(w io.Writer) {
	rtt := r.Rounds.FarthestRTT
	if rtt <= 0 || r.GlobalInterval.Count() == 0 {
		return
	}
	interval := r.GlobalInterval.Quantile(50)
	verdict := func(v, limit time.Duration) string {
		if v <= limit {
			return "within"
		}
		return "over"
	}
	snapLimit := interval + rtt + 10*time.Millisecond
	modes := make([]string, len(r.Snapshots))
	for i, s := range r.Snapshots {
		total := s.Total.Quantile(50)
		modes[i] = fmt.Sprintf("%v %s %s", s.Mode, ms(total), verdict(total, snapLimit))
	}
	fmt.Fprintf(w, "%-40s interval P50 %s %s RTT + 3 = %s; snapshot total P50 ≤ interval + RTT + 10 = %s: %s\n",
		"targets (issue 17), ms", ms(interval), verdict(interval, rtt+3*time.Millisecond), ms(rtt+3*time.Millisecond), ms(snapLimit),
		strings.Join(modes, ", "))
}

// WriteReport writes report.md, results.json and the latency CDFs
// (cdf-regional.png, cdf-snapshot.png, cdf-global-epoch.png) into dir,
// creating it. It returns the report's path.
func (r *Result) WriteReport(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var regional []series
	for i, region := range r.Regions {
		if y := r.YCSB[i]; y != nil {
			regional = append(regional, series{region + " read", y.Latency[ycsb.OpRead]}, series{region + " write", y.Latency[ycsb.OpUpdate]})
		}
	}
	var snaps []series
	counts := make([]string, len(r.Snapshots))
	for i, s := range r.Snapshots {
		snaps = append(snaps, series{s.Mode.String() + ": waiting", s.Wait}, series{s.Mode.String() + ": total", s.Total})
		counts[i] = fmt.Sprintf("%d %v", s.Total.Count(), s.Mode)
	}
	plots := []struct {
		file, title string
		series      []series
	}{
		{"cdf-regional.png", "Regional YCSB-A transactions", regional},
		{"cdf-snapshot.png", "Strong multi-region snapshots from " + r.SnapshotRegion, snaps},
		{"cdf-global-epoch.png", "Global epoch interval", []series{{"interval", r.GlobalInterval}}},
	}
	var errs []error
	for _, p := range plots {
		errs = append(errs, plotCDF(filepath.Join(dir, p.file), p.title, p.series))
	}
	var b strings.Builder
	cfg := r.Config
	fmt.Fprintf(&b, "# Terroir: the Chablis paper's §6.2 on this machine\n\n")
	fmt.Fprintf(&b, "Topology: regions %v, data in %v; %d nodes, all in one process on 127.0.0.1 with the WAN's round trips injected. "+
		"YCSB-A (50%% reads, 50%% updates, uniform) over %d records of 1 KiB per data region from %d threads each, "+
		"and a snapshot reading one key per data region from %s every %v, strong and strong-local by turns, for %v (seed %d).\n\n",
		cfg.Topology.Regions, r.Regions, len(cfg.Topology.Nodes), cfg.Records, cfg.Threads, r.SnapshotRegion, cfg.SnapshotEvery, cfg.Duration, cfg.Seed)
	b.WriteString("| measurement | P50 ms | P99 ms | mean ms | count | × paper | paper |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, rw := range r.rows() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %.2f× | %s |\n", rw.name, ms(rw.h.Quantile(50)), ms(rw.h.Quantile(99)),
			ms(rw.h.Mean()), rw.h.Count(), rw.ratio(), rw.paper)
	}
	b.WriteString("\n× paper compares this run's P50 (the mean where the paper gives a mean) with the paper's figure.\n\n")
	for i, region := range r.Regions {
		if y := r.YCSB[i]; y != nil {
			fmt.Fprintf(&b, "- %s: %.0f YCSB transactions/s, %d retried attempts\n", region, y.Throughput(), y.Retries)
		}
	}
	fmt.Fprintf(&b, "- snapshots: %s completed, %d failed\n", strings.Join(counts, " and "), r.SnapshotFails)
	if r.Rounds.Count[epoch.PhasePublish] > 0 {
		b.WriteString("- ")
		r.Rounds.write(&b)
		b.WriteString("- ")
		r.writeTargets(&b)
	}
	if r.RTT != nil {
		fmt.Fprintf(&b, "- floor on this machine: loopback round trip P50 %s ms, fsync (4 KiB) P50 %s ms\n",
			ms(r.RTT.Quantile(50)), ms(r.Fsync.Quantile(50)))
	}
	if r.DeviceOK {
		fmt.Fprintf(&b, "- disk, every process's: %s\n", r.Device)
	}
	writeHomes(&b, r)
	b.WriteString("\nThe paper ran each region's client on a dedicated VM with eRPC and data in DRAM; here every node and " +
		"client shares this machine's cores, so regional latencies include CPU contention and gRPC. The epoch and snapshot " +
		"figures are dominated by the injected round trips, as in the paper.\n\n")
	for _, p := range plots {
		fmt.Fprintf(&b, "![%s](%s)\n\n", p.title, p.file)
	}
	report := filepath.Join(dir, "report.md")
	errs = append(errs, os.WriteFile(report, []byte(b.String()), 0o644))
	js, err := r.JSON()
	errs = append(errs, err)
	if err == nil {
		errs = append(errs, os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644))
	}
	return report, errors.Join(errs...)
}

// JSON renders the figures for machines (durations in ms).
func (r *Result) JSON() ([]byte, error) {
	type fig struct {
		Name  string  `json:"name"`
		P50   float64 `json:"p50_ms"`
		P99   float64 `json:"p99_ms"`
		Mean  float64 `json:"mean_ms"`
		Count int64   `json:"count"`
		Ratio float64 `json:"ratio_to_paper"`
		Paper string  `json:"paper"`
	}
	f := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	var figs []fig
	for _, rw := range r.rows() {
		figs = append(figs, fig{rw.name, f(rw.h.Quantile(50)), f(rw.h.Quantile(99)), f(rw.h.Mean()), rw.h.Count(), rw.ratio(), rw.paper})
	}
	return json.MarshalIndent(struct {
		Regions   []string `json:"regions"`
		Duration  string   `json:"duration"`
		Seed      uint64   `json:"seed"`
		Records   int      `json:"records"`
		Threads   int      `json:"threads"`
		Figures   []fig    `json:"figures"`
		SnapFails int      `json:"snapshot_failures"`
	}{r.Regions, r.Config.Duration.String(), r.Config.Seed, r.Config.Records, r.Config.Threads, figs, r.SnapshotFails}, "", "  ")
}

type series struct {
	name string
	h    *latency.Histogram
}

// plotCDF draws the latency CDFs of series on a log-scaled latency axis.
func plotCDF(path, title string, ss []series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "fraction of operations"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, false
	drawn := 0
	for i, s := range ss {
		cdf := s.h.CDF()
		if len(cdf) == 0 {
			continue
		}
		xys := make(plotter.XYs, 0, len(cdf))
		for _, pt := range cdf {
			xys = append(xys, plotter.XY{X: max(float64(pt.Latency)/float64(time.Millisecond), 0.001), Y: pt.Fraction})
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(s.name, line)
		drawn++
	}
	if drawn == 0 {
		return nil // nothing was measured: no plot
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// writeHomes adds where the data lived at the end (DESIGN.md §13): each
// range's span, home region, replicas and non-voters, and the placement
// rules with whether the ranges matched them.
func writeHomes(b *strings.Builder, r *Result) {
	if len(r.Homes) == 0 {
		return
	}
	b.WriteString("\n## Where the data lives\n\n| range | span | home region | replicas | non-voters |\n|---:|---|---|---|---|\n")
	for _, h := range r.Homes {
		fmt.Fprintf(b, "| %d | [%q, %q) | %s | %v | %v |\n", h.ID, h.Start, h.End, h.Region, h.Replicas, h.NonVoters)
	}
	if len(r.Placements) == 0 {
		b.WriteString("\nNo placement rules: the spans are homed as the topology file seeded them.\n")
		return
	}
	b.WriteString("\n| placement rule | kind | home | the ranges |\n|---|---|---|---|\n")
	for _, p := range r.Placements {
		state := "match it"
		if len(p.Problems) > 0 {
			state = strings.Join(p.Problems, "; ")
		}
		fmt.Fprintf(b, "| %q | %s | %s | %s |\n", p.Rule.Prefix, p.Rule.Kind, p.Rule.Home, state)
	}
}
