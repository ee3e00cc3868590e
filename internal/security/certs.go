package security

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// ErrNoCerts is returned when a certificates directory lacks a file Terroir
// needs (the CA certificate, or this process's certificate and key).
var ErrNoCerts = errors.New("security: certificates not found")

// ErrBadCert is returned for a file that is not a certificate or key, a
// certificate the cluster CA did not sign, or one of the wrong kind (a client
// certificate where a node's belongs).
var ErrBadCert = errors.New("security: bad certificate")

// ErrExpired is returned for a certificate past its NotAfter (or before its
// NotBefore); the message names the file, its subject and the time.
var ErrExpired = errors.New("security: certificate expired")

// Identity is who a certificate names: a node (Node > 0, with its region) or
// a user.
type Identity struct {
	Node   uint64
	Region string
	User   string
}

// IsNode reports whether the identity is a node's.
func (i Identity) IsNode() bool { return i.Node != 0 }

// IsAdmin reports whether the identity may run operator actions: the admin
// user or a node (a node acts for the operator, as the exclusion policy does).
func (i Identity) IsAdmin() bool { return i.IsNode() || i.User == AdminUser }

// String names the identity as messages do: "node 3 (us-east1)" or "user alice".
func (i Identity) String() string {
	if i.IsNode() {
		return fmt.Sprintf("node %d (%s)", i.Node, i.Region)
	}
	return "user " + i.User
}

// IdentityOf reads the identity a certificate names. A node certificate has
// the common name "node" and a terroir://node/<id>?region=<r> URI; any other
// common name is a user. Errors wrap ErrBadCert.
func IdentityOf(c *x509.Certificate) (Identity, error) {
	if c.Subject.CommonName != NodeCommonName {
		if !namePattern.MatchString(c.Subject.CommonName) {
			return Identity{}, fmt.Errorf("%w: subject %q names no user", ErrBadCert, c.Subject.CommonName)
		}
		return Identity{User: c.Subject.CommonName}, nil
	}
	for _, u := range c.URIs {
		if u.Scheme != "terroir" || u.Host != "node" {
			continue
		}
		id, err := strconv.ParseUint(u.Path[min(1, len(u.Path)):], 10, 64)
		q, qerr := url.ParseQuery(u.RawQuery)
		if err == nil && qerr == nil && id > 0 && q.Get("region") != "" {
			return Identity{Node: id, Region: q.Get("region")}, nil
		}
	}
	return Identity{}, fmt.Errorf("%w: node certificate %s carries no terroir://node/<id>?region= name", ErrBadCert, c.Subject)
}

// reloadEvery bounds how often a handshake checks the files for a change.
const reloadEvery = time.Second

// Certs are one process's certificates: the cluster CA and its own
// certificate and key, reloaded when the files change (rotation without a
// restart: handshakes after the change use the new files; connections already
// open keep theirs). Safe for concurrent use.
type Certs struct {
	dir, certPath, keyPath string
	node                   bool

	mu      sync.Mutex
	cur     *loaded
	checked time.Time
}

type loaded struct {
	pool   *x509.CertPool
	cert   tls.Certificate
	id     Identity
	server *tls.Config // for a node: the configuration its server hands each handshake
	stamp  string      // the three files' sizes and modification times
}

// LoadNode loads a node's certificates from dir: ca.crt, node.crt, node.key.
// Errors: ErrNoCerts, ErrBadCert, ErrExpired, each naming the file.
func LoadNode(dir string) (*Certs, error) {
	return load(&Certs{dir: dir, certPath: filepath.Join(dir, NodeCertFile), keyPath: filepath.Join(dir, NodeKeyFile), node: true})
}

// LoadClient loads user's certificates from dir: ca.crt and
// client.<user>.crt/.key. Errors as LoadNode's.
func LoadClient(dir, user string) (*Certs, error) {
	return load(&Certs{dir: dir, certPath: filepath.Join(dir, ClientCertFile(user)), keyPath: filepath.Join(dir, ClientKeyFile(user))})
}

func load(c *Certs) (*Certs, error) {
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// CertPath returns the file of this process's certificate.
func (c *Certs) CertPath() string { return c.certPath }

// Identity returns who this process's certificate names.
func (c *Certs) Identity() Identity { return c.current().id }

// Reload reads the files now. On an error the certificates in use stay.
func (c *Certs) Reload() error {
	l, err := c.read()
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.cur, c.checked = l, time.Now()
	c.mu.Unlock()
	return nil
}

// current returns the certificates in use, first reloading them if the files
// changed (checked at most every reloadEvery). A failed reload is logged and
// the old certificates stay, so a half-done rotation never takes a node down.
func (c *Certs) current() *loaded {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) < reloadEvery {
		return c.cur
	}
	c.checked = time.Now()
	if s, err := c.stamp(); err == nil && s == c.cur.stamp {
		return c.cur
	}
	l, err := c.read()
	if err != nil {
		// Often a rotation caught between its two renames: the next check retries.
		slog.Warn("certificates changed but cannot be loaded; keeping the previous ones and retrying", "dir", c.dir, "err", err)
		return c.cur
	}
	slog.Info("certificates reloaded", "dir", c.dir, "identity", l.id)
	c.cur = l
	return c.cur
}

func (c *Certs) stamp() (string, error) {
	s := ""
	for _, p := range []string{filepath.Join(c.dir, CACertFile), c.certPath, c.keyPath} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%d@%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return s, nil
}

// read loads and checks the three files.
func (c *Certs) read() (*loaded, error) {
	stamp, _ := c.stamp()
	caPath := filepath.Join(c.dir, CACertFile)
	ca, err := os.ReadFile(caPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCerts, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrBadCert, caPath)
	}
	cert, err := tls.LoadX509KeyPair(c.certPath, c.keyPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", ErrNoCerts, err)
		}
		return nil, fmt.Errorf("%w: %s and %s: %w", ErrBadCert, c.certPath, c.keyPath, err)
	}
	leaf := cert.Leaf
	if err := checkValidity(c.certPath, leaf, time.Now()); err != nil {
		return nil, err
	}
	usage := x509.ExtKeyUsageClientAuth
	if c.node {
		usage = x509.ExtKeyUsageServerAuth
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return nil, fmt.Errorf("%w: %s is not a certificate of the CA in %s: %w", ErrBadCert, c.certPath, caPath, err)
	}
	id, err := IdentityOf(leaf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.certPath, err)
	}
	if c.node != id.IsNode() {
		return nil, fmt.Errorf("%w: %s names %s, not a %s", ErrBadCert, c.certPath, id, map[bool]string{true: "node", false: "user"}[c.node])
	}
	l := &loaded{pool: pool, cert: cert, id: id, stamp: stamp}
	if c.node {
		l.server = &tls.Config{
			MinVersion:                  tls.VersionTLS13,
			DynamicRecordSizingDisabled: true, // full-size records: RPCs, not web pages
			Certificates:                []tls.Certificate{cert},
			ClientAuth:                  tls.RequireAndVerifyClientCert,
			ClientCAs:                   pool,
			NextProtos:                  []string{"h2"},
		}
	}
	return l, nil
}

// checkValidity fails with ErrExpired naming the file when now is outside
// the certificate's validity.
func checkValidity(path string, c *x509.Certificate, now time.Time) error {
	if now.After(c.NotAfter) {
		return fmt.Errorf("%w: %s (%s) expired at %s", ErrExpired, path, c.Subject.CommonName, c.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(c.NotBefore) {
		return fmt.Errorf("%w: %s (%s) is not valid before %s", ErrExpired, path, c.Subject.CommonName, c.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// ServerTLS returns the TLS configuration of a node's server: TLS 1.3, the
// node's current certificate, and a client certificate from the current CA
// required of every peer. Only for certificates from LoadNode.
func (c *Certs) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return c.current().server, nil
		},
	}
}

// ClientTLS returns the TLS configuration for dialing nodes: this process's
// current certificate, and a server that must hold a node certificate of the
// current CA. The CA is checked in VerifyConnection rather than by crypto/tls
// so that a rotated CA file takes effect without a new configuration; host
// names are not checked, since a node's identity is its certificate, not its
// address.
func (c *Certs) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		DynamicRecordSizingDisabled: true, // full-size records: RPCs, not web pages
		InsecureSkipVerify:          true, // verified by VerifyConnection below
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &c.current().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: the server presented no certificate", ErrBadCert)
			}
			leaf := cs.PeerCertificates[0]
			if err := checkValidity("server "+cs.ServerName, leaf, time.Now()); err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.current().pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("%w: server %s: %w", ErrBadCert, cs.ServerName, err)
			}
			if id, err := IdentityOf(leaf); err != nil || !id.IsNode() {
				return fmt.Errorf("%w: server %s does not hold a node certificate", ErrBadCert, cs.ServerName)
			}
			return nil
		},
	}
}
