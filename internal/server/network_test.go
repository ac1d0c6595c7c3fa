package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network"
	"github.com/corralrun/corral/internal/records"
	"github.com/corralrun/corral/internal/sandbox"
	storagefake "github.com/corralrun/corral/internal/storage/fake"
	corral "github.com/corralrun/corral/sdk"
)

// TestNetworkPolicyHeadersAndPlaceholders checks what a create and an
// update accept of header values and placeholders: an update may leave a
// value out, a create may not, a header value may name a secret, and
// placeholders are checked and converted (their stand-ins are the
// Manager's to make).
func TestNetworkPolicyHeadersAndPlaceholders(t *testing.T) {
	withSecret := NetworkPolicy{Headers: []HeaderRule{{Domain: "api.test", Name: "Authorization", Value: "Bearer {{secret:openai}}"}}}
	if got, err := withSecret.policy(false); err != nil || got.Headers[0].Value != "Bearer {{secret:openai}}" {
		t.Errorf("a header naming a secret: %+v %v", got, err)
	}
	noValue := NetworkPolicy{Headers: []HeaderRule{{Domain: "api.test", Name: "Authorization"}}}
	if got, err := noValue.policy(true); err != nil || len(got.Headers) != 1 || got.Headers[0].Value != "" {
		t.Errorf("an update keeping a header's value: %+v %v", got, err)
	}
	if _, err := noValue.policy(false); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a create without a header value: %v", err)
	}
	for _, tt := range []struct {
		name string
		rule PlaceholderRule
		kind error
	}{
		{"valid", PlaceholderRule{Domain: "api.openai.com", Env: "OPENAI_API_KEY", Secret: "openai", Body: true}, nil},
		{"no domain", PlaceholderRule{Env: "K", Secret: "s"}, errdefs.ErrInvalidArgument},
		{"domain with a port", PlaceholderRule{Domain: "a.test:443", Env: "K", Secret: "s"}, errdefs.ErrInvalidArgument},
		{"bad env", PlaceholderRule{Domain: "a.test", Env: "1KEY", Secret: "s"}, errdefs.ErrInvalidArgument},
		{"env with =", PlaceholderRule{Domain: "a.test", Env: "K=V", Secret: "s"}, errdefs.ErrInvalidArgument},
		{"bad secret", PlaceholderRule{Domain: "a.test", Env: "K", Secret: "Not A Name"}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, update := range []bool{false, true} {
				p := NetworkPolicy{Placeholders: []PlaceholderRule{tt.rule}}
				got, err := p.policy(update)
				if !errors.Is(err, tt.kind) {
					t.Errorf("update %v: %v, want %v", update, err, tt.kind)
				}
				want := []egress.PlaceholderRule{{Domain: tt.rule.Domain, Env: tt.rule.Env, Secret: tt.rule.Secret, Body: tt.rule.Body}}
				if err == nil && !cmp.Equal(got.Placeholders, want) {
					t.Errorf("update %v: placeholders %+v, want %+v", update, got.Placeholders, want)
				}
			}
		})
	}
}

func TestNetworkPolicySyntax(t *testing.T) {
	tests := []struct {
		name    string
		in      NetworkPolicy
		want    egress.Policy
		wantErr string
	}{
		{"empty", NetworkPolicy{}, egress.Policy{}, ""},
		{"rules", NetworkPolicy{Mode: "allowlist",
			AllowDomains: []string{"example.test", "*.pypi.test:443,8443"},
			AllowCIDRs:   []string{"10.0.0.0/8:443", "203.0.113.7", "198.51.100.0/24"},
			Headers:      []HeaderRule{{Domain: "api.test", Name: "Authorization", Value: "Bearer x"}}},
			egress.Policy{Mode: egress.ModeAllowlist,
				Domains: []egress.DomainRule{{Name: "example.test"}, {Name: "*.pypi.test", Ports: []uint16{443, 8443}}},
				CIDRs: []egress.CIDRRule{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: []uint16{443}},
					{Prefix: netip.MustParsePrefix("203.0.113.7/32")}, {Prefix: netip.MustParsePrefix("198.51.100.0/24")}},
				Headers: []egress.HeaderRule{{Domain: "api.test", Name: "Authorization", Value: "Bearer x"}}}, ""},
		{"bad port", NetworkPolicy{AllowDomains: []string{"a.test:http"}}, egress.Policy{}, "ports are numbers"},
		{"port zero", NetworkPolicy{AllowCIDRs: []string{"10.0.0.0/8:0"}}, egress.Policy{}, "ports are numbers"},
		{"ipv6", NetworkPolicy{AllowCIDRs: []string{"2001:db8::/32"}}, egress.Policy{}, "IPv6"},
		{"not an address", NetworkPolicy{AllowCIDRs: []string{"example.test"}}, egress.Policy{}, "want ADDRESS"},
		{"empty rule", NetworkPolicy{AllowDomains: []string{":443"}}, egress.Policy{}, "empty rule"},
		{"header without value", NetworkPolicy{Headers: []HeaderRule{{Domain: "a.test", Name: "X-Key"}}}, egress.Policy{}, "a value is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.policy(false)
			if tt.wantErr != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want invalid argument with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
			// The view shows the same rules back, without header values.
			if tt.in.Mode == "" {
				return
			}
			view := networkView(got)
			want := tt.in
			want.AllowCIDRs = []string{"10.0.0.0/8:443", "203.0.113.7/32", "198.51.100.0/24"}
			for i := range want.Headers {
				want.Headers[i].Value = ""
			}
			if diff := cmp.Diff(&want, view); diff != "" {
				t.Errorf("view (-want +got):\n%s", diff)
			}
		})
	}
}

// netLayer is a network layer that keeps policies in memory.
type netLayer struct {
	mu   sync.Mutex
	nets map[string]egress.Policy
}

func (n *netLayer) Setup(_ context.Context, id string, p egress.Policy) (*network.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nets[id] = p
	return &network.Sandbox{ID: id, Mode: p.Mode, NetNSPath: "/fake/" + id}, nil
}

func (n *netLayer) Update(_ context.Context, id string, p egress.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if (n.nets[id].Mode == egress.ModeNone) != (p.Mode == egress.ModeNone) {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "changing network mode needs a new sandbox")
	}
	n.nets[id] = p
	return nil
}

func (n *netLayer) Teardown(_ context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nets, id)
	return nil
}

func (n *netLayer) Get(id string) (network.Sandbox, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.nets[id]
	return network.Sandbox{ID: id, Mode: p.Mode}, ok
}

func (n *netLayer) Reconcile(context.Context, map[string]egress.Policy) error { return nil }

func (n *netLayer) policy(id string) egress.Policy {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nets[id]
}

// TestNetworkOverHTTP creates a sandbox with a policy, reads it back with
// the header value redacted, replaces it live and checks the errors.
func TestNetworkOverHTTP(t *testing.T) {
	sock, err := os.MkdirTemp("", "srv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	drv, err := fake.New(fake.Config{Root: sock})
	if err != nil {
		t.Fatal(err)
	}
	st, err := records.Open(t.Context(), filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	nl := &netLayer{nets: map[string]egress.Policy{}}
	m, err := sandbox.New(sandbox.Config{Store: st, Storage: storagefake.New(t.TempDir()), Drivers: []driver.Driver{drv},
		Network: nl, NetworkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(Config{Manager: m, Version: "test", Storage: "fake"}).Handler())
	c, err := corral.New(ts.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		ts.Close()
		for _, sb := range m.List(context.Background(), sandbox.Filter{}) {
			_ = m.Delete(context.Background(), sb.ID)
		}
		m.Close()
		st.Close()
	})
	ctx := t.Context()
	if _, err := c.ImportTemplate(ctx, "bb", emptyTar()); err != nil {
		t.Fatal(err)
	}
	const secret = "Bearer s3cret-value"
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb", Network: &corral.NetworkPolicy{
		AllowDomains: []string{"example.test"},
		Headers:      []corral.HeaderRule{{Domain: "example.test", Name: "Authorization", Value: secret}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := &corral.NetworkPolicy{Mode: "allowlist", AllowDomains: []string{"example.test"},
		Headers: []corral.HeaderRule{{Domain: "example.test", Name: "Authorization"}}}
	if diff := cmp.Diff(want, sb.Network); diff != "" {
		t.Errorf("created policy (-want +got):\n%s", diff)
	}
	if got := nl.policy(sb.ID); len(got.Headers) != 1 || got.Headers[0].Value != secret {
		t.Errorf("network layer got headers %+v, want the secret", got.Headers)
	}
	for _, path := range []string{"/v1/sandboxes/" + sb.ID, "/v1/sandboxes"} {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "s3cret") || !strings.Contains(string(body), `"Authorization"`) {
			t.Errorf("GET %s shows %s", path, body)
		}
	}

	got, err := c.UpdateNetwork(ctx, sb.ID, corral.NetworkPolicy{AllowDomains: []string{"*.other.test:8443"}, AllowCIDRs: []string{"203.0.113.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	want = &corral.NetworkPolicy{Mode: "allowlist", AllowDomains: []string{"*.other.test:8443"}, AllowCIDRs: []string{"203.0.113.0/24"}}
	if diff := cmp.Diff(want, got.Network); diff != "" {
		t.Errorf("updated policy (-want +got):\n%s", diff)
	}
	if p := nl.policy(sb.ID); len(p.Domains) != 1 || p.Domains[0].Name != "*.other.test" {
		t.Errorf("network layer has %+v", p)
	}
	errorCases := []struct {
		name string
		id   string
		p    corral.NetworkPolicy
		want string
	}{
		{"to none", sb.ID, corral.NetworkPolicy{Mode: "none"}, corral.CodeFailedPrecondition},
		{"bad mode", sb.ID, corral.NetworkPolicy{Mode: "everything"}, corral.CodeInvalidArgument},
		{"bad cidr", sb.ID, corral.NetworkPolicy{AllowCIDRs: []string{"10.0.0.0/33"}}, corral.CodeInvalidArgument},
		{"header without value", sb.ID, corral.NetworkPolicy{Headers: []corral.HeaderRule{{Domain: "a.test", Name: "X"}}}, corral.CodeInvalidArgument},
		{"unknown sandbox", "nosuchsandbox", corral.NetworkPolicy{}, corral.CodeNotFound},
	}
	for _, tt := range errorCases {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := c.UpdateNetwork(ctx, tt.id, tt.p); corral.ErrorCode(err) != tt.want {
				t.Errorf("UpdateNetwork: %v, want code %s", err, tt.want)
			}
		})
	}
	if _, err := c.Create(ctx, corral.CreateOptions{Template: "bb", Network: &corral.NetworkPolicy{Mode: "none", AllowDomains: []string{"a.test"}}}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Errorf("create with rules in mode none: %v", err)
	}
}
