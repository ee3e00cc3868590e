package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/topology"
	"github.com/terroir-db/terroir/internal/transport"
	"github.com/terroir-db/terroir/internal/transport/transportpb"
)

// ErrNoNode is returned (as a *NoNodeError) by Reach when no node of the
// cluster answered.
var ErrNoNode = errors.New("admin: no node answered")

// NoNodeError says which nodes Reach tried and why each did not answer.
type NoNodeError struct {
	Topology string   // the topology file
	Tried    []string // "node 1 at 127.0.0.1:7101: connection refused", by node id
}

func (e *NoNodeError) Error() string {
	return fmt.Sprintf("no node of %s answered (tried %s)", e.Topology, strings.Join(e.Tried, "; "))
}

// Is makes errors.Is(err, ErrNoNode) hold.
func (e *NoNodeError) Is(target error) bool { return target == ErrNoNode }

// ReachTimeout bounds Reach: a command against a cluster that is down fails
// within it instead of waiting out its own deadline.
const ReachTimeout = 2 * time.Second

// Reach pings every node of top at once and returns as soon as one answers.
// When none does within ReachTimeout (or ctx's end, if sooner), it fails
// with ErrNoNode naming the topology (name) and every node tried with why
// it did not answer, in the user's terms.
func Reach(ctx context.Context, d *transport.Dialer, top *topology.Topology, name string) error {
	ctx, cancel := context.WithTimeout(ctx, ReachTimeout)
	defer cancel()
	type answer struct {
		node topology.Node
		err  error
	}
	answers := make(chan answer, len(top.Nodes))
	for _, n := range top.Nodes {
		go func() {
			conn, err := d.Conn(n.ID)
			if err == nil {
				_, err = transportpb.NewTransportClient(conn).Ping(ctx, &transportpb.PingRequest{})
			}
			answers <- answer{n, err}
		}()
	}
	failed := make([]answer, 0, len(top.Nodes))
	for range top.Nodes {
		a := <-answers
		if a.err == nil {
			return nil
		}
		failed = append(failed, a)
	}
	slices.SortFunc(failed, func(a, b answer) int { return cmp.Compare(a.node.ID, b.node.ID) })
	e := &NoNodeError{Topology: name}
	for _, a := range failed {
		why := Describe(a.err)
		if !d.Secure() && strings.HasSuffix(why, "EOF") {
			why = "the node closed the connection: it expects TLS (connect with --certs-dir instead of --insecure)"
		}
		e.Tried = append(e.Tried, fmt.Sprintf("node %d at %s: %s", a.node.ID, a.node.Addr, why))
	}
	return e
}

// Describe renders an RPC error in an operator's terms: the gRPC envelope
// ("rpc error: code = … desc = …", "connection error", "transport: Error
// while dialing") is dropped, and what is left is the cause — connection
// refused, a deadline, a refused certificate.
func Describe(err error) string {
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	return CleanRPCText(msg)
}

// rpcNoise is the text gRPC wraps around a cause.
var rpcNoise = []string{
	"transport: Error while dialing: ", "transport: authentication handshake failed: ", "error reading server preface: ",
}

// quotedDesc is gRPC's `connection error: desc = "cause"`.
var quotedDesc = regexp.MustCompile(`connection error: desc = "([^"]*)"`)

// closedRead is how a connection that timed out mid-handshake reads.
var closedRead = regexp.MustCompile(`raw-read tcp \S+: use of closed network connection`)

// CleanRPCText removes gRPC's envelopes from msg, wherever in a wrapped
// error's text they are, and names the causes an operator meets most.
func CleanRPCText(msg string) string {
	for {
		i := strings.Index(msg, "rpc error: code = ")
		if i < 0 {
			break
		}
		rest := msg[i+len("rpc error: code = "):]
		j := strings.Index(rest, " desc = ")
		if j < 0 {
			msg = msg[:i] + rest
			continue
		}
		msg = msg[:i] + rest[j+len(" desc = "):]
	}
	msg = quotedDesc.ReplaceAllString(msg, "$1")
	msg = closedRead.ReplaceAllString(msg, "no answer in time")
	for _, n := range rpcNoise {
		msg = strings.ReplaceAll(msg, n, "")
	}
	switch {
	case strings.Contains(msg, "context deadline exceeded") && !strings.Contains(msg, "connect"):
		msg = strings.ReplaceAll(msg, "context deadline exceeded", "no answer in time")
	case strings.Contains(msg, "remote error: tls: expired certificate"):
		msg = strings.ReplaceAll(msg, "remote error: tls: expired certificate", "the node refused this client's certificate: it has expired")
	case strings.Contains(msg, "remote error: tls: unknown certificate authority"), strings.Contains(msg, "remote error: tls: bad certificate"):
		msg = strings.NewReplacer("remote error: tls: unknown certificate authority", "the node refused this client's certificate: not signed by the cluster CA",
			"remote error: tls: bad certificate", "the node refused this client's certificate").Replace(msg)
	case strings.Contains(msg, "tls: first record does not look like a TLS handshake"):
		msg = strings.ReplaceAll(msg, "tls: first record does not look like a TLS handshake", "the node speaks plaintext (started with --insecure); connect with --insecure")
	}
	return strings.TrimSpace(msg)
}
