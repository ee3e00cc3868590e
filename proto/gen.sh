#!/usr/bin/env bash
# Regenerates the committed protobuf code. Needs protoc, protoc-gen-go and
# protoc-gen-go-grpc on PATH; building the project does not.
set -euo pipefail
cd "$(dirname "$0")/.."
raft=$(go list -m -f '{{.Dir}}' go.etcd.io/raft/v3)/raftpb
gen() { # proto file, output package dir
  protoc -I proto -I "$raft" --go_out=. --go_opt=module=github.com/terroir-db/terroir \
    --go-grpc_out=. --go-grpc_opt=module=github.com/terroir-db/terroir "proto/$1"
}
gen transport.proto
gen epoch.proto
gen txnstate.proto
gen range.proto
gen directory.proto
gen node.proto
