package console_test

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/localcluster"
)

// chromium finds a Chromium binary. Without one the test is skipped, unless
// TERROIR_REQUIRE_CHROMIUM is set (CI installs Debian's chromium and sets it).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("TERROIR_REQUIRE_CHROMIUM") != "" {
		t.Fatal("no chromium on PATH (apt-get install chromium)")
	}
	t.Skip("no chromium on PATH; CI installs it")
	return ""
}

// browse loads url in headless Chromium, lets the page run for budget of
// virtual time (its fetches complete first), and returns the DOM; with
// screenshot set it saves a PNG there instead.
func browse(t *testing.T, bin, url string, budget time.Duration, screenshot string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=" + strconv.Itoa(int(budget.Milliseconds())), "--window-size=1280,1800"}
	if screenshot != "" {
		args = append(args, "--screenshot="+screenshot)
	} else {
		args = append(args, "--dump-dom")
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, errOut.String())
	}
	return out.String()
}

var epochCard = regexp.MustCompile(`id="epoch-us-east1"><h3>us-east1 local epoch</h3><div class="epoch">(\d+)</div>`)

// TestConsoleInHeadlessChromium: a three-region cluster's console, loaded
// in a real browser, shows every region and node up, the epochs advancing
// and the ranges; a killed node then shows down; a screenshot is saved.
func TestConsoleInHeadlessChromium(t *testing.T) {
	bin := chromium(t)
	c := localcluster.StartT(t, "../../examples/three-regions.yaml", localcluster.Options{})
	// Let every range get a leader and a lease first.
	d := c.Dialer("us-east1")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := admin.Status(ctx, d, c.Topology)
		cancel()
		settled := err == nil && st.GlobalEpoch > 0
		for _, r := range st.Ranges {
			settled = settled && r.Leader != 0
		}
		if settled && len(st.Ranges) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not settle: %+v %v", st, err)
		}
	}
	url := "http://" + c.Node(1).HTTPAddr() + "/"

	dom := browse(t, bin, url, 3*time.Second, "")
	if !strings.Contains(dom, `data-loaded="true"`) {
		t.Fatalf("the page never loaded its data:\n%s", dom)
	}
	for _, r := range c.Topology.Regions {
		if !strings.Contains(dom, `data-region="`+r+`"`) {
			t.Errorf("the page shows no card for region %s", r)
		}
	}
	for _, n := range c.Topology.Nodes {
		row := regexp.MustCompile(`data-node="` + strconv.FormatUint(n.ID, 10) + `"><span>node \d+ [^<]+</span><span class="up">up</span>`)
		if !row.MatchString(dom) {
			t.Errorf("node %d is not shown up", n.ID)
		}
	}
	for _, want := range []string{`id="epoch-global"`, `<td>us-west1</td>`, `<td>local-epoch</td>`, `id="chart-one-phase-commits"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	m := epochCard.FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no us-east1 local epoch on the page:\n%s", dom)
	}
	first, _ := strconv.ParseUint(m[1], 10, 64)

	// Load: one-phase commits through node 1's ranges, for the charts.
	db, err := c.Client("us-east1")
	if err != nil {
		t.Fatal(err)
	}
	loadCtx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for i := 0; loadCtx.Err() == nil; i++ {
			_ = db.Update(loadCtx, func(ctx context.Context, tx *client.Txn) error {
				return tx.Put(ctx, []byte("a"+strconv.Itoa(i%100)), []byte("v"))
			})
		}
	}()
	defer func() { stopLoad(); <-loaded }()

	if err := c.KillNode(5); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	dom = browse(t, bin, url, 3*time.Second, "")
	if !regexp.MustCompile(`data-node="5"><span>node 5 [^<]+</span><span class="down">down</span>`).MatchString(dom) {
		t.Errorf("killed node 5 is not shown down:\n%s", dom)
	}
	if m := epochCard.FindStringSubmatch(dom); m == nil {
		t.Error("no us-east1 local epoch after the kill")
	} else if later, _ := strconv.ParseUint(m[1], 10, 64); later <= first {
		t.Errorf("the us-east1 local epoch did not advance: %d then %d", first, later)
	}
	// The charts are the serving node's own: browse the leader of the
	// loaded range, twice, since a node samples from the first request on.
	url = "http://" + c.Node(c.Leader(100)).HTTPAddr() + "/"
	browse(t, bin, url, time.Second, "")
	time.Sleep(2500 * time.Millisecond)
	dom = browse(t, bin, url, 3*time.Second, "")
	if !regexp.MustCompile(`id="chart-(one|two)-phase-commit[^"]*">.*?P50 [0-9.]+ ms · P99 [0-9.]+ ms`).MatchString(dom) {
		t.Errorf("no commit latency charted under load:\n%s", dom)
	}

	dir := os.Getenv("TERROIR_ARTIFACTS")
	if dir == "" {
		dir = os.TempDir()
	}
	shot := filepath.Join(dir, "terroir-console.png")
	browse(t, bin, url, 3*time.Second, shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil || img.Bounds().Dx() < 800 {
		t.Fatalf("screenshot %s: %v, %v", shot, img, err)
	}
	t.Logf("screenshot of the console: %s", shot)
}
