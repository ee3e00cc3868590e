#!/usr/bin/env bash
# Runs the same YCSB workload against a 3-member etcd cluster and a one-region,
# three-node Terroir cluster on this machine, with the same durability (each
# commit fsync'd by a majority of replicas), and prints both side by side.
#
#   scripts/bench-etcd.sh [workload (a–f, default a)] [duration (default 10s)]
#
# It builds a pinned etcd server (tools/etcd, from the Go module proxy) and
# terroir into ./bin, starts the etcd members on 127.0.0.1:23{79,80,81}, and
# stops everything it started on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-a}
duration=${2:-10s}
mkdir -p bin
echo "building etcd (tools/etcd) and terroir..."
(cd tools/etcd && go build -o ../../bin/etcd .)
go build -o bin/terroir ./cmd/terroir

data=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT

cluster="m1=http://127.0.0.1:2390,m2=http://127.0.0.1:2391,m3=http://127.0.0.1:2392"
for i in 1 2 3; do
  client=$((2378 + i)) peer=$((2389 + i))
  bin/etcd --name "m$i" --data-dir "$data/m$i" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new --log-level error >"$data/m$i.log" 2>&1 &
  pids+=($!)
done

bin/terroir bench ycsb --target etcd://127.0.0.1:2379,127.0.0.1:2380,127.0.0.1:2381 --versus-terroir \
  --workload "$workload" --duration "$duration" --records 10000 --clients 16
