package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/client"
	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/security"
	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
)

// connFlags are the flags of every command that connects to a running
// cluster: which certificates to present, or --insecure (DESIGN.md §15).
type connFlags struct {
	certsDir string
	user     string
	insecure bool
	// askRegion: the command runs transactions where its client is, so on a
	// cluster of several regions --region must say which (kv).
	askRegion bool
}

// addConnFlags registers --certs-dir, --user and --insecure on cmd (and its
// subcommands).
func addConnFlags(cmd *cobra.Command) *connFlags {
	f := &connFlags{}
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.certsDir, "certs-dir", "certs", "directory of the cluster CA's certificate (ca.crt) and this user's (client.<user>.crt, .key)")
	fs.StringVar(&f.user, "user", security.AdminUser, "whose client certificate to present")
	fs.BoolVar(&f.insecure, "insecure", false, "connect without TLS, to a cluster started with --insecure")
	return f
}

// options returns the client options the flags describe.
func (f *connFlags) options(region string) client.Options {
	return client.Options{Region: region, CertsDir: f.certsDir, User: f.user, Insecure: f.insecure}
}

// certs loads the flags' certificates (nil with --insecure), with a message
// that says how to make them when they are missing.
func (f *connFlags) certs() (*security.Certs, error) {
	certs, err := f.options("").LoadCerts()
	if errors.Is(err, security.ErrNoCerts) {
		return nil, fmt.Errorf("%w\n  create them with `terroir cert create-ca` and `terroir cert create-client %s` (see `terroir cert --help`), point --certs-dir at them, or pass --insecure for a cluster started with --insecure", err, f.user)
	}
	return certs, err
}

// clusterConn is a connection to a running cluster.
type clusterConn struct {
	top    *topology.Topology
	region string
	d      *transport.Dialer
}

// connect dials the cluster and checks that some node answers within
// admin.ReachTimeout, so a command against a cluster that is down fails
// fast, naming every node it tried.
func (f *connFlags) connect(ctx context.Context, path, region string) (*clusterConn, error) {
	cn, err := f.dial(path, region)
	if err != nil {
		return nil, err
	}
	if err := admin.Reach(ctx, cn.d, cn.top, path); err != nil {
		cn.Close()
		return nil, err
	}
	return cn, nil
}

// dial loads the topology at path and the certificates and returns a
// dialer into the cluster, located in region ("": the region the CLI's
// coordinator runs in); nothing is sent yet.
func (f *connFlags) dial(path, region string) (*clusterConn, error) {
	top, err := topology.Load(path)
	if err != nil {
		return nil, err
	}
	switch {
	case region == "" && f.askRegion && len(top.Regions) > 1:
		return nil, fmt.Errorf("%w: %s has %d regions (%s): pass --region to say which one this client runs in", client.ErrNoRegion, path, len(top.Regions), strings.Join(top.Regions, ", "))
	case region == "":
		region = coordinatorRegion(top)
	case !top.HasRegion(region):
		return nil, fmt.Errorf("%w: --region %q is not a region of %s (its regions: %s)", client.ErrUnknownRegion, region, path, strings.Join(top.Regions, ", "))
	}
	certs, err := f.certs()
	if err != nil {
		return nil, err
	}
	d := transport.NewDialer(transport.NewNetwork(top), transport.Endpoint{Region: region}, certs)
	return &clusterConn{top: top, region: region, d: d}, nil
}

// client opens a transaction client on the connection.
func (c *clusterConn) client() (*client.DB, error) {
	return client.OpenWithDialer(c.top, c.region, c.d)
}

// Close closes the connection.
func (c *clusterConn) Close() { c.d.Close() }

// withConn runs fn with a connection to the cluster of path and a context
// bounded by timeout.
func (f *connFlags) withConn(c *cobra.Command, path, region string, timeout time.Duration, fn func(ctx context.Context, cn *clusterConn) error) error {
	ctx, cancel := context.WithTimeout(c.Context(), timeout)
	defer cancel()
	cn, err := f.connect(ctx, path, region)
	if err != nil {
		return err
	}
	defer cn.Close()
	return fn(ctx, cn)
}

// withClient runs fn with a transaction client of the cluster, as withConn.
func (f *connFlags) withClient(c *cobra.Command, path, region string, timeout time.Duration, fn func(ctx context.Context, db *client.DB, cn *clusterConn) error) error {
	return f.withConn(c, path, region, timeout, func(ctx context.Context, cn *clusterConn) error {
		db, err := cn.client()
		if err != nil {
			return err
		}
		defer db.Close()
		return fn(ctx, db, cn)
	})
}
