package nemesis

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/epoch"
	"github.com/terroir-db/terroir/internal/topology"
)

// epochPoll is how often the monitor reads every epoch group.
const epochPoll = 20 * time.Millisecond

// epochMonitor reads every epoch group (each region's local epoch and
// publisher, and the global epoch service) from inside its region throughout
// the campaign, and checks the reads against DESIGN.md §3:
//   - invariant 1 (and the same of publishers and the service): a read that
//     begins after another of the same group returned is not lower;
//   - invariant 2: a read of a publisher that begins after any read of the
//     global epoch (a publisher's or the service's) returned e is ≥ e-1;
//   - a read of the service that begins after a publisher showed e is ≥ e:
//     a strong snapshot reads at the service's epoch + 1, so it would miss
//     a transaction that committed at e in that publisher's region.
//
// A publisher cut off and excluded must refuse to serve, not serve stale.
type epochMonitor struct {
	cp      *campaign
	sources []epochSource
	mu      sync.Mutex
	reads   []epochRead
}

type epochSource struct {
	name   string
	global bool // a publisher or the service: the global epoch
	pub    bool // a publisher
	reader *epoch.Reader
}

// epochRead is one successful read: source index, when it was called and
// returned (ns since the campaign began), and the epoch.
type epochRead struct {
	Source       int
	Call, Return int64
	Epoch        uint64
}

func newEpochMonitor(cp *campaign) (*epochMonitor, error) {
	m := &epochMonitor{cp: cp}
	top := cp.cfg.Topology
	for _, kind := range []topology.Kind{topology.KindLocalEpoch, topology.KindPublisher, topology.KindGlobalEpoch} {
		for _, g := range top.GroupsOfKind(kind, "") {
			region := g.Region
			if kind == topology.KindGlobalEpoch {
				region = "" // the service has no home region of its own
			}
			r, err := cp.c.Reader(kind, g.Region, region)
			if err != nil {
				return nil, err
			}
			m.sources = append(m.sources, epochSource{name: fmt.Sprintf("%s %s", g.Region, kind),
				global: kind != topology.KindLocalEpoch, pub: kind == topology.KindPublisher, reader: r})
		}
	}
	return m, nil
}

func (m *epochMonitor) run(ctx context.Context, _ []*client.DB, wg *sync.WaitGroup) {
	for i := range m.sources {
		wg.Add(1)
		go func() { defer wg.Done(); m.poll(ctx, i) }()
	}
}

// poll reads source i every epochPoll until ctx ends.
func (m *epochMonitor) poll(ctx context.Context, i int) {
	tick := time.NewTicker(epochPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		call := m.cp.now()
		read := m.sources[i].reader.Read
		if m.cp.quiet() { // a read in a quiet spell leaves the epochs idle
			read = m.sources[i].reader.ReadBackground
		}
		e, err := read(rctx)
		ret := m.cp.now()
		cancel()
		if err == nil {
			m.mu.Lock()
			m.reads = append(m.reads, epochRead{Source: i, Call: call, Return: ret, Epoch: e})
			m.mu.Unlock()
		}
	}
}

func (m *epochMonitor) final(context.Context, *client.DB) {}

func (m *epochMonitor) check() {
	m.cp.mu.Lock()
	m.cp.sum.EpochReads = len(m.reads)
	m.cp.mu.Unlock()
	for _, a := range m.violations() {
		m.cp.anomaly("epochs: %s", a)
	}
}

// violations sweeps the reads in call order, keeping per source the highest
// epoch returned before the current call, and the highest global epoch.
func (m *epochMonitor) violations() []string {
	byCall := append([]epochRead(nil), m.reads...)
	byReturn := append([]epochRead(nil), m.reads...)
	sort.Slice(byCall, func(a, b int) bool { return byCall[a].Call < byCall[b].Call })
	sort.Slice(byReturn, func(a, b int) bool { return byReturn[a].Return < byReturn[b].Return })
	highest := make([]uint64, len(m.sources))
	var global, published uint64
	globalFrom, publishedFrom := 0, 0
	var out []string
	j := 0
	for _, r := range byCall {
		for ; j < len(byReturn) && byReturn[j].Return < r.Call; j++ {
			done := byReturn[j]
			highest[done.Source] = max(highest[done.Source], done.Epoch)
			if m.sources[done.Source].global && done.Epoch > global {
				global, globalFrom = done.Epoch, done.Source
			}
			if m.sources[done.Source].pub && done.Epoch > published {
				published, publishedFrom = done.Epoch, done.Source
			}
		}
		src := m.sources[r.Source]
		if r.Epoch < highest[r.Source] {
			out = append(out, fmt.Sprintf("%s went back from %d to %d (read at %v)", src.name, highest[r.Source], r.Epoch, time.Duration(r.Call)))
		}
		if src.pub && r.Epoch+1 < global {
			out = append(out, fmt.Sprintf("%s served %d after %s had returned %d (read at %v): global epoch invariant broken",
				src.name, r.Epoch, m.sources[globalFrom].name, global, time.Duration(r.Call)))
		}
		if src.global && !src.pub && r.Epoch < published {
			out = append(out, fmt.Sprintf("%s returned %d after %s had shown %d (read at %v): a strong snapshot would miss what committed at %d",
				src.name, r.Epoch, m.sources[publishedFrom].name, published, time.Duration(r.Call), published))
		}
		if len(out) > 20 {
			return append(out, "… (more)")
		}
	}
	return out
}

// dump writes the reads as JSON.
func (m *epochMonitor) dump(dir string) error {
	names := make([]string, len(m.sources))
	for i, s := range m.sources {
		names[i] = s.name
	}
	b, err := json.Marshal(struct {
		Sources []string
		Reads   []epochRead
	}{names, m.reads})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "epoch-reads.json"), b, 0o644)
}
