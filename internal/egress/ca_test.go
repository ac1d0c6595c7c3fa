package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "egress-ca")
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"ca.crt": 0o644, "ca.key": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v mode %v, want %04o", name, err, fi.Mode().Perm(), want)
		}
	}
	if b, _ := pem.Decode(ca.CertPEM()); b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("CertPEM is not a PEM certificate: %q", ca.CertPEM())
	}
	if bytes.Contains(ca.CertPEM(), []byte("PRIVATE")) {
		t.Error("CertPEM contains a private key")
	}
	again, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.CertPEM(), ca.CertPEM()) {
		t.Error("a second LoadCA made a new CA")
	}

	t.Run("key readable by others", func(t *testing.T) {
		d := t.TempDir()
		if _, err := LoadCA(d); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(d, "ca.key"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCA(d); err == nil || !strings.Contains(err.Error(), "readable by group or others") {
			t.Errorf("LoadCA = %v", err)
		}
	})
	t.Run("only one file", func(t *testing.T) {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "ca.crt"), ca.CertPEM(), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCA(d); err == nil {
			t.Error("LoadCA with a certificate and no key succeeded")
		}
	})
	t.Run("key of another CA", func(t *testing.T) {
		d := t.TempDir()
		if _, err := LoadCA(d); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "ca.crt"), ca.CertPEM(), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCA(d); err == nil || !strings.Contains(err.Error(), "does not match") {
			t.Errorf("LoadCA = %v", err)
		}
	})
}

func TestLeaf(t *testing.T) {
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca.now = func() time.Time { return now }
	c1, err := ca.leaf("api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	if _, err := c1.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.test", Roots: roots, CurrentTime: now}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	if got := c1.Leaf.DNSNames; len(got) != 1 || got[0] != "api.example.test" {
		t.Errorf("SANs %v", got)
	}
	if d := c1.Leaf.NotAfter.Sub(now); d > leafValidity {
		t.Errorf("leaf valid for %v", d)
	}
	if c2, _ := ca.leaf("api.example.test"); c2 != c1 {
		t.Error("leaf not cached")
	}
	now = now.Add(leafValidity - leafRenew + time.Minute)
	if c3, _ := ca.leaf("api.example.test"); c3 == c1 || !c3.Leaf.NotAfter.After(c1.Leaf.NotAfter) {
		t.Error("leaf not renewed before it expires")
	}
	for i := range maxLeaves + 10 {
		if _, err := ca.leaf(fmt.Sprintf("n%d.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(ca.leaves); n > maxLeaves {
		t.Errorf("cache holds %d leaves, bound is %d", n, maxLeaves)
	}
}
