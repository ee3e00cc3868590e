// Command etcd builds a pinned etcd server from the Go module proxy, for
// scripts/bench-etcd.sh. etcd's own main module cannot be installed with
// `go install` (its go.mod has replace directives), so this module depends on
// the server module and calls its entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
