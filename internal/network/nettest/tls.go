package nettest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Certs are a throwaway CA and one server certificate it signed.
type Certs struct {
	Pool   *x509.CertPool // trusts the CA
	CAPEM  []byte         // the CA's certificate, for trust stores in files
	Server tls.Certificate
}

// NewCerts makes a CA and a certificate for names, valid for a day.
func NewCerts(t testing.TB, names ...string) *Certs {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "corral test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &Certs{Pool: pool, CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Server: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}

// EchoHandler answers every request with one line naming the server
// (label), the local address that accepted it, the Host header, the TLS
// SNI and the Authorization header, so tests can see who was reached and
// what arrived. GET /bytes?n=N streams N zero bytes instead, for
// throughput measurements.
func EchoHandler(label string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bytes" {
			n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			_, _ = io.CopyN(w, zeros{}, n)
			return
		}
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		local := ""
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(interface{ String() string }); ok {
			local = a.String()
		}
		fmt.Fprintf(w, "server=%s local=%s host=%s sni=%s auth=%s\n", label, local, r.Host, sni, r.Header.Get("Authorization"))
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Field returns the value of key in an EchoHandler line.
func Field(line, key string) string {
	for f := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}
