#!/usr/bin/env bash
# Runs the same YCSB workload against a 3-member etcd cluster and a one-region,
# three-node Terroir cluster on this machine, symmetrically: each system runs
# as three server processes (etcd members; `terroir start` nodes of
# examples/one-region.yaml, plaintext), with the same durability (each commit
# fsync'd by a majority of replicas: etcd's default, and Terroir's Raft), and
# one driver process (`terroir bench ycsb`) runs the workload on etcd and on
# Terroir in alternating slices (etcd, Terroir, etcd, ...: --pairs), so
# that both see the same minutes of this machine, whose speed swings by
# tens of percent from one to the next. It prints each pair's throughput
# ratio and their median, both systems side by side, then each system's
# CPU time per operation of its slices, summed over its three processes (from
# /proc/<pid>/stat), beside the driver's own; for Terroir also the RPCs its
# nodes served per operation by method, and the Raft groups each node led
# (from their /metrics), which tell the run's layout of leaders.
#
#   scripts/bench-etcd.sh [workload (a–f, default a)] [duration (default 10s)] [pairs (default 4)]
#
# Each system runs for the whole duration, in pairs slices of duration/pairs.
#
# It builds a pinned etcd server (tools/etcd, from the Go module proxy) and
# terroir into ./bin, starts the etcd members on 127.0.0.1:23{79,80,81} (peers
# 23{90,91,92}) and the Terroir nodes on 127.0.0.1:710{1,2,3} (HTTP 810{1,2,3}),
# refuses to start (exit status 2) while any of these ports is taken, waits
# (at most 60 s each) until both clusters serve, stops the driver if it
# runs past twice the duration plus 300 s, and stops everything it started on
# exit. Data and server logs go to a temporary directory, removed on
# exit.
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-a}
duration=${2:-10s}
pairs=${3:-4}
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "bench-etcd: pairs $pairs: want a positive whole number" >&2; exit 2; }
# The driver gets twice the run (one per system) plus 300 s for loading and
# connecting, then is stopped; so the duration is whole hours, minutes or
# seconds here (10s, 1m30s), which bash can add up.
source scripts/duration.sh
source scripts/ports.sh
run_secs=$(duration_secs bench-etcd "$duration") || exit 2
ports_free bench-etcd 2379 2380 2381 2390 2391 2392 7101 7102 7103 8101 8102 8103
mkdir -p bin
echo "building etcd (tools/etcd) and terroir..."
(cd tools/etcd && go build -o ../../bin/etcd .)
go build -o bin/terroir ./cmd/terroir

data=$(mktemp -d)
pids=()
cleanup() {
  local p i
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for i in $(seq 100); do # at most 10 s for them to exit, then SIGKILL
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# fail prints why the script gives up, with the tail of each server log.
fail() {
  echo "bench-etcd: $*" >&2
  for log in "$data"/*.log; do
    [ -e "$log" ] && { echo "--- $log" >&2; tail -n 5 "$log" >&2; }
  done
  exit 1
}

# await runs the command until it succeeds, for at most 60 s, checking that
# every server process still runs.
await() {
  local what=$1
  shift
  local deadline=$((SECONDS + 60)) p
  until "$@" >/dev/null 2>&1; do
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a server process ($p) exited while waiting for $what"; done
    [ "$SECONDS" -ge "$deadline" ] && fail "$what did not serve within 60 s"
    sleep 0.5
  done
}

etcd_pids=()
cluster="m1=http://127.0.0.1:2390,m2=http://127.0.0.1:2391,m3=http://127.0.0.1:2392"
for i in 1 2 3; do
  client=$((2378 + i)) peer=$((2389 + i))
  bin/etcd --name "m$i" --data-dir "$data/m$i" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new --log-level error >"$data/m$i.log" 2>&1 &
  pids+=($!) etcd_pids+=($!)
done

terroir_pids=()
for i in 1 2 3; do
  bin/terroir start --config examples/one-region.yaml --node "$i" --data-dir "$data/t$i" --insecure >"$data/t$i.log" 2>&1 &
  pids+=($!) terroir_pids+=($!)
done

echo "waiting for etcd and terroir to serve..."
# etcd's /health is true once the cluster has a leader; a Terroir transaction
# commits once the epoch, transaction-state and range groups have leaders.
await "etcd" curl -sf --max-time 2 http://127.0.0.1:2379/health
await "terroir" bin/terroir kv --config examples/one-region.yaml --insecure --timeout 2s put bench-etcd-ready 1

join() { local IFS=,; echo "$*"; }
# In the background, so that a signal to this script stops it at once (bash
# runs a trap only once its foreground command is done); its exit status is
# the script's.
timeout --kill-after=10s $((2 * run_secs + 300)) \
  bin/terroir bench ycsb --target etcd://127.0.0.1:2379,127.0.0.1:2380,127.0.0.1:2381 --target-pids "$(join "${etcd_pids[@]}")" \
  --versus-terroir --cluster examples/one-region.yaml --insecure --cluster-pids "$(join "${terroir_pids[@]}")" \
  --workload "$workload" --duration "$duration" --pairs "$pairs" --records 10000 --clients 16 &
pids+=($!)
wait $!
