#!/usr/bin/env bash
# Profiles a one-region Terroir cluster under YCSB, as scripts/bench-etcd.sh
# runs it: three `terroir start` processes of examples/one-region.yaml
# (plaintext, with --pprof) and `terroir bench ycsb --cluster` printing every
# minute's throughput (--every 1m). At each of the given times (seconds after
# the nodes serve) it takes a 30 s CPU profile of every node and then its
# /metrics and store size, into OUTDIR as <at>s-n<node>.prof, <at>s-m<node>.txt
# and <at>s-du.txt, for `go tool pprof -top bin/terroir OUTDIR/<at>s-n*.prof`.
# Issue 17's steady state: profiles at minute 1 and minute 12 of a 14-minute
# run showed the compactions' growing cost.
#
#   scripts/profile-ycsb.sh OUTDIR DURATION AT...   (e.g. /tmp/p 14m 75 750)
#
# It builds terroir into ./bin, uses 127.0.0.1:710{1,2,3} (HTTP 810{1,2,3})
# and refuses to start (exit status 2) while one is taken, waits at most 60 s for the cluster to serve, stops the driver after the
# duration plus 300 s, and stops the nodes and removes their data on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then
  echo "usage: scripts/profile-ycsb.sh OUTDIR DURATION AT_SECONDS..." >&2
  exit 2
fi
out=$1 duration=$2
shift 2
for at in "$@"; do
  [[ $at =~ ^[0-9]+$ ]] || { echo "profile-ycsb: $at: give whole seconds" >&2; exit 2; }
done
source scripts/duration.sh
source scripts/ports.sh
run_secs=$(duration_secs profile-ycsb "$duration") || exit 2
ports_free profile-ycsb 7101 7102 7103 8101 8102 8103
mkdir -p bin "$out"
go build -o bin/terroir ./cmd/terroir

data=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for i in 1 2 3; do
  bin/terroir start --config examples/one-region.yaml --node "$i" --data-dir "$data/t$i" --insecure --pprof >"$data/t$i.log" 2>&1 &
  pids+=($!)
done
node_pids=$(IFS=,; echo "${pids[*]}")
deadline=$((SECONDS + 60))
until bin/terroir kv --config examples/one-region.yaml --insecure --timeout 2s put profile-ycsb-ready 1 >/dev/null 2>&1; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "profile-ycsb: the cluster did not serve within 60 s" >&2
    tail -n 5 "$data"/t*.log >&2
    exit 1
  fi
  sleep 0.5
done

# grab AT: at AT seconds, every node's CPU profile (30 s), then its metrics.
grab() {
  local at=$1 i
  sleep "$at"
  for i in 1 2 3; do
    curl -sf --max-time 40 -o "$out/${at}s-n$i.prof" "http://127.0.0.1:810$i/debug/pprof/profile?seconds=30" &
  done
  wait
  for i in 1 2 3; do curl -sf --max-time 5 "http://127.0.0.1:810$i/metrics" >"$out/${at}s-m$i.txt" || true; done
  du -sk "$data"/t1 "$data"/t2 "$data"/t3 >"$out/${at}s-du.txt"
}
grabs=()
for at in "$@"; do
  grab "$at" &
  grabs+=($!)
  pids+=($!)
done

timeout --kill-after=10s $((run_secs + 300)) \
  bin/terroir bench ycsb --cluster examples/one-region.yaml --insecure --cluster-pids "$node_pids" \
  --workload a --duration "$duration" --every 1m --records 10000 --clients 16 | tee "$out/ycsb.txt" &
pids+=($!)
wait $!
for g in "${grabs[@]}"; do wait "$g" || true; done
echo "profiles and metrics in $out"
