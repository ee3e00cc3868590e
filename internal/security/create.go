// Package security gives Terroir's nodes and clients their identities and
// checks them (DESIGN.md §15): a cluster CA, node certificates naming a node
// id and region, client certificates naming a user, mutual TLS on every
// connection, and which RPCs each identity may call.
//
// A certificates directory is laid out as CockroachDB's `certs/` is:
//
//	ca.crt                the cluster CA's certificate (every node and client)
//	ca.key                the CA's key (only where certificates are made; keep it elsewhere)
//	node.crt, node.key    a node's certificate and key
//	client.<user>.crt/key a user's certificate and key
package security

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// File names inside a certificates directory.
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
)

// NodeCommonName is the subject common name of every node certificate; a
// client certificate may not use it as its user name.
const NodeCommonName = "node"

// AdminUser is the user whose certificate may run operator actions
// (exclusion, splits and merges, GC settings).
const AdminUser = "admin"

// Default certificate lifetimes.
const (
	DefaultCALifetime   = 10 * 365 * 24 * time.Hour
	DefaultCertLifetime = 5 * 365 * 24 * time.Hour
)

// ErrExists is returned when a file that would be written already exists
// and overwriting was not asked for; nothing is written.
var ErrExists = errors.New("security: file exists")

// ErrInvalid is returned for a bad user name, node id, region or lifetime.
var ErrInvalid = errors.New("security: invalid certificate request")

// ClientCertFile and ClientKeyFile name a user's certificate and key.
func ClientCertFile(user string) string { return "client." + user + ".crt" }

// ClientKeyFile names a user's private key.
func ClientKeyFile(user string) string { return "client." + user + ".key" }

// CreateOptions tune certificate creation.
type CreateOptions struct {
	// Lifetime is how long the certificate is valid from now (0: the default
	// for its kind). A negative lifetime makes a certificate that has already
	// expired, for tests of refusal.
	Lifetime time.Duration
	// Overwrite replaces existing files instead of failing with ErrExists.
	Overwrite bool
}

// CreateCA writes a new cluster CA: ca.crt into certsDir and its key to
// caKey (certsDir/ca.key when empty). Errors: ErrExists, file system errors.
func CreateCA(certsDir, caKey string, opts CreateOptions) error {
	if caKey == "" {
		caKey = filepath.Join(certsDir, CAKeyFile)
	}
	certPath := filepath.Join(certsDir, CACertFile)
	if err := checkFree(opts.Overwrite, certPath, caKey); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl, err := template(pkix.Name{CommonName: "Terroir CA", Organization: []string{"Terroir"}}, lifetime(opts, DefaultCALifetime))
	if err != nil {
		return err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	return writePair(certsDir, certPath, der, caKey, key)
}

// nodeURI is the URI subject alternative name that carries a node
// certificate's node id and region: terroir://node/<id>?region=<region>.
func nodeURI(id uint64, region string) *url.URL {
	return &url.URL{Scheme: "terroir", Host: "node", Path: "/" + strconv.FormatUint(id, 10), RawQuery: url.Values{"region": {region}}.Encode()}
}

// CreateNode writes node.crt and node.key into certsDir for node id of
// region, valid as a server for hosts (DNS names or IP addresses; none means
// localhost and 127.0.0.1) and as a client of other nodes, signed by the CA
// of certsDir/ca.crt and caKey (certsDir/ca.key when empty). Errors:
// ErrInvalid, ErrExists, ErrNoCerts (no CA), ErrBadCert.
func CreateNode(certsDir, caKey string, id uint64, region string, hosts []string, opts CreateOptions) error {
	if id == 0 || !namePattern.MatchString(region) {
		return fmt.Errorf("%w: a node certificate needs a node id > 0 and a region name (letters, digits, '-', '_', '.'), got node %d region %q", ErrInvalid, id, region)
	}
	if len(hosts) == 0 {
		hosts = []string{"localhost", "127.0.0.1"}
	}
	tmpl, err := template(pkix.Name{CommonName: NodeCommonName, Organization: []string{"Terroir"}, OrganizationalUnit: []string{region}}, lifetime(opts, DefaultCertLifetime))
	if err != nil {
		return err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.URIs = []*url.URL{nodeURI(id, region)}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return signInto(certsDir, caKey, NodeCertFile, NodeKeyFile, tmpl, opts)
}

// CreateClient writes client.<user>.crt and .key into certsDir for user,
// signed by the CA as CreateNode's is. Errors: ErrInvalid (a bad user name,
// or "node"), ErrExists, file errors.
func CreateClient(certsDir, caKey, user string, opts CreateOptions) error {
	if !namePattern.MatchString(user) || user == NodeCommonName {
		return fmt.Errorf("%w: user name %q: use letters, digits, '-', '_' or '.', and not %q", ErrInvalid, user, NodeCommonName)
	}
	tmpl, err := template(pkix.Name{CommonName: user, Organization: []string{"Terroir"}}, lifetime(opts, DefaultCertLifetime))
	if err != nil {
		return err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return signInto(certsDir, caKey, ClientCertFile(user), ClientKeyFile(user), tmpl, opts)
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func lifetime(opts CreateOptions, def time.Duration) time.Duration {
	if opts.Lifetime == 0 {
		return def
	}
	return opts.Lifetime
}

// template is a certificate valid for life from an hour ago (clock skew
// between the machines that make and check it); a negative life ends it
// before now.
func template(subject pkix.Name, life time.Duration) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notBefore := now.Add(-time.Hour)
	if life < 0 {
		notBefore = now.Add(life - time.Hour)
	}
	return &x509.Certificate{
		SerialNumber: serial, Subject: subject,
		NotBefore: notBefore, NotAfter: now.Add(life),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}, nil
}

// signInto signs tmpl with the CA and writes it and a new key into certsDir.
func signInto(certsDir, caKey, certName, keyName string, tmpl *x509.Certificate, opts CreateOptions) error {
	if caKey == "" {
		caKey = filepath.Join(certsDir, CAKeyFile)
	}
	certPath, keyPath := filepath.Join(certsDir, certName), filepath.Join(certsDir, keyName)
	if err := checkFree(opts.Overwrite, certPath, keyPath); err != nil {
		return err
	}
	caPriv, err := readKey(caKey)
	if err != nil {
		return err
	}
	ca, err := caOf(filepath.Join(certsDir, CACertFile), caPriv)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caPriv)
	if err != nil {
		return fmt.Errorf("security: sign %s with %s: %w", certName, caKey, err)
	}
	return writePair(certsDir, certPath, der, keyPath, key)
}

func checkFree(overwrite bool, paths ...string) error {
	if overwrite {
		return nil
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%w: %s (pass --overwrite to replace it)", ErrExists, p)
		}
	}
	return nil
}

// writePair writes a certificate (0644) and its key (0600), each through a
// temporary file renamed into place, so a node reloading them never reads a
// half-written file.
func writePair(dir, certPath string, der []byte, keyPath string, key *ecdsa.PrivateKey) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(keyPath), 0o700); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return writeAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// caOf returns the certificate of the PEM file at path whose public key is
// key's: during a CA rotation ca.crt holds the old and the new CA, and a
// certificate must name the one that signs it as its parent.
func caOf(path string, key any) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCerts, err)
	}
	signer, ok := key.(interface{ Public() crypto.PublicKey })
	if !ok {
		return nil, fmt.Errorf("%w: the CA key is not a signing key", ErrBadCert)
	}
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrBadCert, path, err)
		}
		if pub, ok := c.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); ok && pub.Equal(signer.Public()) {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w: %s holds no certificate of the CA key", ErrBadCert, path)
}

// readKey reads a PKCS#8 or SEC 1 PEM private key.
func readKey(path string) (any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCerts, err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%w: %s holds no PEM key", ErrBadCert, path)
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: not a PKCS#8 or EC private key", ErrBadCert, path)
	}
	return k, nil
}
