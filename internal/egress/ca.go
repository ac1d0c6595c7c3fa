package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Leaf certificates the CA issues live leafValidity and are issued again
// once less than leafRenew remains; at most maxLeaves are cached.
const (
	leafValidity = 24 * time.Hour
	leafRenew    = time.Hour
	leafBackdate = time.Hour // tolerates a sandbox clock slightly behind
	maxLeaves    = 1024
	caValidity   = 10 * 365 * 24 * time.Hour
)

// CA is the certificate authority the proxy signs its stand-in server
// certificates with when it intercepts HTTPS for header and placeholder
// rules. Sandboxes trust its certificate (CertPEM); its key stays in the
// daemon. Methods are safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
	now    func() time.Time
}

// LoadCA loads the CA kept in dir as ca.crt (mode 0644) and ca.key (mode
// 0600, an ECDSA P-256 key), creating dir and both files on first use. A
// key readable by others, a key that does not match the certificate, or
// only one of the two files is an error: the CA is never replaced
// silently, since sandboxes already trust it.
func LoadCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		return createCA(dir, certPath, keyPath)
	case certErr != nil:
		return nil, fmt.Errorf("loading egress CA: %w", certErr)
	case keyErr != nil:
		return nil, fmt.Errorf("loading egress CA: %w", keyErr)
	}
	return readCA(certPath, keyPath)
}

func createCA(dir, certPath, keyPath string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("creating egress CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "Corral egress CA", Organization: []string{"Corral"}},
		NotBefore:             now.Add(-leafBackdate),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating egress CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding egress CA key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating egress CA directory: %w", err)
	}
	// The key first: a crash in between leaves a key without a
	// certificate, which LoadCA reports instead of guessing.
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, err
	}
	return readCA(certPath, keyPath)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // fails harmlessly after the rename
	if err := f.Chmod(mode); err == nil {
		_, err = f.Write(data)
		if err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func readCA(certPath, keyPath string) (*CA, error) {
	fi, err := os.Stat(keyPath)
	if err != nil {
		return nil, fmt.Errorf("loading egress CA: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("loading egress CA: %s is readable by group or others (mode %04o); make it 0600", keyPath, fi.Mode().Perm())
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("loading egress CA: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("loading egress CA: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil {
		return nil, fmt.Errorf("loading egress CA: %s or %s is not PEM", certPath, keyPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("loading egress CA certificate %s: %w", certPath, err)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("loading egress CA key %s: %w", keyPath, err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("loading egress CA key %s: want an ECDSA P-256 key", keyPath)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("loading egress CA: %s does not match %s", keyPath, certPath)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("loading egress CA: %s is not a CA certificate", certPath)
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("loading egress CA: %s expired on %s; remove both files to make a new CA (sandboxes created before then keep trusting the old one)", certPath, cert.NotAfter.Format(time.DateOnly))
	}
	return &CA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		key:     key,
		leaves:  map[string]*tls.Certificate{},
		now:     time.Now,
	}, nil
}

// CertPEM returns the CA certificate, PEM-encoded, for sandboxes to add
// to their trust stores. The caller must not modify it.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// leaf returns a server certificate for name signed by the CA, from the
// cache while it has more than leafRenew left. Signing one costs a key
// generation and a signature (well under a millisecond); it happens under
// the lock, so concurrent handshakes for a new name sign once.
func (ca *CA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	now := ca.now()
	if c, ok := ca.leaves[name]; ok && now.Add(leafRenew).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("creating a certificate key for %s: %w", name, err)
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-leafBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %s: %w", name, err)
	}
	if len(ca.leaves) >= maxLeaves {
		ca.evict(now)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	ca.leaves[name] = c
	return c, nil
}

// evict drops the certificates that need renewal, or, if none do, the one
// that expires first.
func (ca *CA) evict(now time.Time) {
	var first string
	for name, c := range ca.leaves {
		if !now.Add(leafRenew).Before(c.Leaf.NotAfter) {
			delete(ca.leaves, name)
		} else if first == "" || c.Leaf.NotAfter.Before(ca.leaves[first].Leaf.NotAfter) {
			first = name
		}
	}
	if len(ca.leaves) >= maxLeaves {
		delete(ca.leaves, first)
	}
}

// randomSerial returns a positive 127-bit serial number (RFC 5280 §4.1.2.2
// allows up to 20 octets). crypto/rand.Read never returns an error.
func randomSerial() *big.Int {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b[:])
}
