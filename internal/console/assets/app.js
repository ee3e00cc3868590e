// The console polls this node's /api/status (the cluster as the node sees
// it: the same report as `terroir status --json`) and /api/latency (series
// the node computes from its own Prometheus histograms), and redraws.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
};

function renderEpochs(s) {
  const box = $("#epochs");
  box.replaceChildren();
  if (s.global_epoch) {
    box.append(el("div", { class: "card", id: "epoch-global" }, el("h3", {}, "global epoch"),
      el("div", { class: "epoch" }, String(s.global_epoch))));
  }
  for (const r of s.regions.filter((r) => r.local_epoch)) {
    const card = el("div", { class: "card", id: "epoch-" + r.name }, el("h3", {}, r.name + " local epoch"),
      el("div", { class: "epoch" }, String(r.local_epoch)));
    if (r.publisher_epoch) card.append(el("div", { class: "muted" }, "publisher at " + r.publisher_epoch));
    box.append(card);
  }
}

function renderRegions(s) {
  const box = $("#regions");
  box.replaceChildren();
  for (const r of s.regions) {
    const card = el("div", { class: "card region", "data-region": r.name }, el("h3", {}, r.name));
    if (r.excluded) card.append(el("div", { class: "excluded" }, "excluded since " + (r.excluded_since ? "epoch " + r.excluded_since : "an unrecorded epoch")));
    for (const n of s.nodes.filter((n) => n.region === r.name)) {
      card.append(el("div", { class: "node", "data-node": String(n.id) },
        el("span", {}, "node " + n.id + " " + n.addr),
        el("span", { class: n.up ? "up" : "down" }, n.up ? "up" : "down")));
    }
    box.append(card);
  }
}

function renderRanges(s) {
  const body = $("#ranges tbody");
  body.replaceChildren();
  for (const r of s.ranges) {
    const lease = r.lease_holder ? "node " + r.lease_holder + " [" + r.lease_start + ", " + r.lease_end + ")" : "–";
    body.append(el("tr", {}, el("td", {}, String(r.id)), el("td", {}, "[" + r.start + ", " + (r.end || "∞") + ")"),
      el("td", {}, r.region), el("td", {}, r.leader ? "node " + r.leader : "none"), el("td", {}, lease),
      el("td", {}, r.epochs_left == null ? "–" : String(r.epochs_left)), el("td", {}, String(r.closed_epoch))));
  }
}

function renderGroups(s) {
  const body = $("#groups tbody");
  body.replaceChildren();
  for (const g of s.groups) {
    const lag = (g.replicas || []).map((p) => "n" + p.node + ":" + (p.lag == null ? "?" : p.lag)).join(" ");
    body.append(el("tr", {}, el("td", {}, String(g.id)), el("td", {}, g.kind), el("td", {}, g.region),
      el("td", {}, g.leader ? "node " + g.leader : "none"), el("td", {}, String(g.term)), el("td", {}, String(g.applied)),
      el("td", {}, lag)));
  }
}

// drawChart plots series {name, points: [[t ms, p50 ms, p99 ms]]} on a canvas.
function drawChart(series) {
  const id = "chart-" + series.name.replace(/[^a-z0-9]+/gi, "-");
  let box = document.getElementById(id);
  if (!box) {
    box = el("div", { class: "chart", id }, el("h3", {}, series.name), el("canvas", { width: "360", height: "140" }),
      el("div", { class: "muted legend" }));
    $("#charts").append(box);
  }
  const c = box.querySelector("canvas"), ctx = c.getContext("2d");
  ctx.clearRect(0, 0, c.width, c.height);
  const pts = series.points;
  const last = pts[pts.length - 1];
  box.querySelector(".legend").textContent = last
    ? "P50 " + last[1].toFixed(2) + " ms · P99 " + last[2].toFixed(2) + " ms · " + last[3].toFixed(0) + "/s"
    : "no requests yet";
  if (pts.length < 2) return;
  const t0 = pts[0][0], t1 = last[0], ymax = Math.max(0.1, ...pts.map((p) => p[2])) * 1.1;
  const x = (t) => 30 + (c.width - 35) * (t - t0) / Math.max(1, t1 - t0);
  const y = (v) => c.height - 15 - (c.height - 25) * v / ymax;
  ctx.fillStyle = "#666";
  ctx.font = "10px sans-serif";
  ctx.fillText(ymax.toFixed(1) + " ms", 0, 10);
  for (const [i, color] of [[1, "#1a73e8"], [2, "#c5221f"]]) {
    ctx.strokeStyle = color;
    ctx.beginPath();
    pts.forEach((p, j) => (j ? ctx.lineTo(x(p[0]), y(p[i])) : ctx.moveTo(x(p[0]), y(p[i]))));
    ctx.stroke();
  }
}

async function poll() {
  try {
    const [s, lat] = await Promise.all([fetch("api/status").then((r) => r.json()), fetch("api/latency").then((r) => r.json())]);
    $("#served-by").textContent = "node " + s.node.id + " (" + s.node.region + ") · " + s.node.version;
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
    renderEpochs(s);
    renderRegions(s);
    renderRanges(s);
    renderGroups(s);
    for (const series of lat.series) drawChart(series);
    document.body.dataset.loaded = "true";
    $("#error").hidden = true;
  } catch (e) {
    $("#error").hidden = false;
    $("#error").textContent = "cannot reach this node: " + e;
  }
}

poll();
setInterval(poll, 1000);
