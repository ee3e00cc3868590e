#!/usr/bin/env bash
# The tests, under the race detector. The client package's tests (78 of them,
# each against real clusters of three to nine nodes in one process) take about
# 8–9.5 min alone and are the most sensitive to a loaded machine: beside another
# package's test binary on 2 cores, a cluster's goroutines waited long enough
# for nodes to declare each other unresponsive. So it runs first, alone; then
# every other package, as many at once as go test chooses. Extra arguments go
# to both go test commands (for example -count=1).
set -euo pipefail
cd "$(dirname "$0")/.."
go test -race -timeout 30m "$@" ./client
go test -race -timeout 30m "$@" $(go list ./... | grep -vx 'github.com/terroir-db/terroir/client')
