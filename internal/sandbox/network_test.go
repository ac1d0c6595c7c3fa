package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network/fakenet"
	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/wire"
)

// comparePrefixes lets cmp compare policies, which hold netip.Prefix.
var comparePrefixes = cmpopts.EquateComparable(netip.Prefix{})

// newNetHarness is a harness whose Manager has the fake network layer.
func newNetHarness(t *testing.T, mod func(*Config)) (*harness, *fakenet.Network) {
	t.Helper()
	fn := fakenet.New()
	dir := t.TempDir()
	h := newHarness(t, func(c *Config) {
		c.Network = fn
		c.NetworkDir = dir
		if mod != nil {
			mod(c)
		}
	})
	return h, fn
}

// assertNetClean checks that no network and no name service file is left
// once background teardowns ended (Close waits for them).
func assertNetClean(t *testing.T, h *harness, fn *fakenet.Network) {
	t.Helper()
	h.m.Close()
	if ids := fn.IDs(); len(ids) != 0 {
		t.Errorf("networks left: %v", ids)
	}
	if files, _ := os.ReadDir(h.cfg.NetworkDir); len(files) != 0 {
		t.Errorf("network files left: %d", len(files))
	}
}

func TestNetworkCreateDelete(t *testing.T) {
	allow := egress.Policy{Domains: []egress.DomainRule{{Name: "Example.TEST."}},
		CIDRs: []egress.CIDRRule{{Prefix: netip.MustParsePrefix("203.0.113.7/24"), Ports: []uint16{443}}}}
	tests := []struct {
		name     string
		def      egress.Mode
		spec     egress.Policy
		want     egress.Policy
		wantHost string // nameserver in resolv.conf
	}{
		{"server default", "", egress.Policy{}, egress.Policy{Mode: egress.ModeNone}, "127.0.0.1"},
		{"open default", egress.ModeOpen, egress.Policy{}, egress.Policy{Mode: egress.ModeOpen}, "10.99.0.1"},
		{"rules imply allowlist", "", allow, egress.Policy{Mode: egress.ModeAllowlist,
			Domains: []egress.DomainRule{{Name: "example.test"}},
			CIDRs:   []egress.CIDRRule{{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Ports: []uint16{443}}}}, "10.99.0.1"},
		{"rules imply allowlist with default open", egress.ModeOpen, egress.Policy{Domains: []egress.DomainRule{{Name: "a.test"}}},
			egress.Policy{Mode: egress.ModeAllowlist, Domains: []egress.DomainRule{{Name: "a.test"}}}, "10.99.0.1"},
		{"explicit mode", egress.ModeOpen, egress.Policy{Mode: egress.ModeNone}, egress.Policy{Mode: egress.ModeNone}, "127.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, fn := newNetHarness(t, func(c *Config) { c.DefaultNetwork = tt.def })
			ctx := t.Context()
			sb, err := h.m.Create(ctx, Spec{Template: "tiny", Network: tt.spec})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, sb.Network, comparePrefixes); diff != "" {
				t.Errorf("sandbox policy (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, fn.Policy(sb.ID), comparePrefixes); diff != "" {
				t.Errorf("network layer policy (-want +got):\n%s", diff)
			}
			recs, _ := h.store.Sandboxes(ctx)
			if len(recs) != 1 || recs[0].Network.Mode != tt.want.Mode {
				t.Errorf("store holds %+v", recs)
			}
			spec, err := h.drv.Spec(sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			n := spec.Network
			if n == nil || n.NetNSPath != "/fake/netns/"+sb.ID {
				t.Fatalf("driver network %+v", n)
			}
			resolv, _ := os.ReadFile(n.ResolvConf)
			hosts, _ := os.ReadFile(n.Hosts)
			if !strings.HasPrefix(string(resolv), "nameserver "+tt.wantHost+"\n") || !strings.Contains(string(hosts), sb.ID) {
				t.Errorf("resolv.conf %q, hosts %q", resolv, hosts)
			}
			// Processes see the proxy environment unless they set it.
			out := execOut(t, h, sb.ID, wire.ExecRequest{Shell: "echo $HTTP_PROXY,$https_proxy", Env: map[string]string{"https_proxy": "mine"}})
			want := ",mine\n"
			if tt.want.Mode != egress.ModeNone {
				want = "http://10.99.0.1:15002,mine\n"
			}
			if out != want {
				t.Errorf("proxy environment %q, want %q", out, want)
			}
			if err := h.m.Delete(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			assertNetClean(t, h, fn)
			h.assertClean(t)
		})
	}
}

func execOut(t *testing.T, h *harness, id string, req wire.ExecRequest) string {
	t.Helper()
	var out strings.Builder
	err := h.m.Exec(t.Context(), id, req, func(ev wire.ExecEvent) error {
		if ev.Type == wire.EventStdout {
			out.Write(ev.Bytes())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestNetworkCreateRejects(t *testing.T) {
	h, fn := newNetHarness(t, nil)
	_, err := h.m.Create(t.Context(), Spec{Template: "tiny", Network: egress.Policy{Mode: "wide"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown mode: %v", err)
	}
	_, err = h.m.Create(t.Context(), Spec{Template: "tiny", Network: egress.Policy{Mode: egress.ModeNone, Domains: []egress.DomainRule{{Name: "x.test"}}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("rules in mode none: %v", err)
	}
	assertNetClean(t, h, fn)
	h.assertClean(t)

	// Without a network layer only mode none works.
	plain := newHarness(t, nil)
	if _, err := plain.m.Create(t.Context(), Spec{Template: "tiny", Network: egress.Policy{Mode: egress.ModeOpen}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("open without network support: %v", err)
	}
	sb, err := plain.m.Create(t.Context(), Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if spec, _ := plain.drv.Spec(sb.ID); spec.Network != nil {
		t.Errorf("driver got a network without a network layer: %+v", spec.Network)
	}
}

// errNetBoom is the network's failure where storage fails too.
var errNetBoom = errors.New("network boom")

func TestNetworkRollsBack(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name string
		mod  func(h *harness, fn *fakenet.Network)
	}{
		{"network fails", func(h *harness, fn *fakenet.Network) { fn.FailSetup(boom) }},
		// Storage and network are set up at once: the network made while
		// the root failed is released.
		{"storage fails", func(h *harness, fn *fakenet.Network) {
			h.storage.SetFailCreateRoot(func(string) error { return boom })
		}},
		{"both fail", func(h *harness, fn *fakenet.Network) {
			fn.FailSetup(errNetBoom)
			h.storage.SetFailCreateRoot(func(string) error { return boom })
		}},
		{"driver fails", func(h *harness, fn *fakenet.Network) { h.setFailDriver(func(string) error { return boom }) }},
		{"store fails to record running", func(h *harness, fn *fakenet.Network) {
			h.store.failPut = func(sb Sandbox) error {
				if sb.State == StateRunning {
					return boom
				}
				return nil
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, fn := newNetHarness(t, nil)
			tt.mod(h, fn)
			_, err := h.m.Create(t.Context(), Spec{Template: "tiny", Network: egress.Policy{Mode: egress.ModeAllowlist}})
			if !errors.Is(err, boom) {
				t.Fatalf("create error %v, want boom", err)
			}
			if tt.name == "both fail" && !errors.Is(err, errNetBoom) {
				t.Errorf("create error %v: the network's error is lost", err)
			}
			// Rollback is synchronous: nothing is left even before Close.
			if ids := fn.IDs(); len(ids) != 0 {
				t.Errorf("networks left: %v", ids)
			}
			h.store.failPut = nil
			assertNetClean(t, h, fn)
			h.assertClean(t)
		})
	}
}

// TestNetworkTeardownInBackground checks that Delete returns before the
// network is torn down, and that Close waits for the teardown.
func TestNetworkTeardownInBackground(t *testing.T) {
	h, fn := newNetHarness(t, nil)
	sb, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	release := fn.BlockTeardowns()
	deleted := make(chan error, 1)
	go func() { deleted <- h.m.Delete(context.Background(), sb.ID) }()
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Delete waited for the network teardown")
	}
	if _, err := h.m.Get(context.Background(), sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("sandbox still visible after Delete: %v", err)
	}
	if ids := fn.IDs(); len(ids) != 1 {
		t.Fatalf("network torn down before the teardown could run: %v", ids)
	}
	closed := make(chan struct{})
	go func() {
		h.m.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a teardown was pending")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	<-closed
	assertNetClean(t, h, fn)
}

func TestUpdateNetwork(t *testing.T) {
	h, fn := newNetHarness(t, nil)
	ctx := t.Context()
	listed, err := h.m.Create(ctx, Spec{Template: "tiny", Network: egress.Policy{Domains: []egress.DomainRule{{Name: "a.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	closed, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	newPolicy := egress.Policy{Domains: []egress.DomainRule{{Name: "B.test"}},
		Headers: []egress.HeaderRule{{Domain: "b.test", Name: "Authorization", Value: "Bearer s3cret"}}}
	want := egress.Policy{Mode: egress.ModeAllowlist, Domains: []egress.DomainRule{{Name: "b.test"}},
		Headers: []egress.HeaderRule{{Domain: "b.test", Name: "Authorization", Value: "Bearer s3cret"}}}
	got, err := h.m.UpdateNetwork(ctx, listed.ID, newPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got.Network, comparePrefixes); diff != "" {
		t.Errorf("returned policy (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, fn.Policy(listed.ID), comparePrefixes); diff != "" {
		t.Errorf("live policy (-want +got):\n%s", diff)
	}
	recs, _ := h.store.Sandboxes(ctx)
	for _, r := range recs {
		if r.ID == listed.ID {
			if diff := cmp.Diff(want, r.Network, comparePrefixes); diff != "" {
				t.Errorf("stored policy (-want +got):\n%s", diff)
			}
		}
	}
	errorCases := []struct {
		name string
		id   string
		p    egress.Policy
		want error
	}{
		{"to none", listed.ID, egress.Policy{Mode: egress.ModeNone}, errdefs.ErrFailedPrecondition},
		{"from none", closed.ID, egress.Policy{Mode: egress.ModeOpen}, errdefs.ErrFailedPrecondition},
		{"rules for none", closed.ID, egress.Policy{Domains: []egress.DomainRule{{Name: "x.test"}}}, errdefs.ErrFailedPrecondition},
		{"invalid domain", listed.ID, egress.Policy{Domains: []egress.DomainRule{{Name: "-/"}}}, errdefs.ErrInvalidArgument},
		{"unknown sandbox", "nosuch", egress.Policy{}, errdefs.ErrNotFound},
	}
	for _, tt := range errorCases {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := h.m.UpdateNetwork(ctx, tt.id, tt.p); !errors.Is(err, tt.want) {
				t.Errorf("UpdateNetwork: %v, want %v", err, tt.want)
			}
		})
	}
	// A failed update changes nothing.
	if diff := cmp.Diff(want, fn.Policy(listed.ID), comparePrefixes); diff != "" {
		t.Errorf("live policy after failed updates (-want +got):\n%s", diff)
	}
	// A header rule sent back without its value (the API never returns
	// one) keeps the value the sandbox has; a new rule needs one.
	keep := egress.Policy{Domains: []egress.DomainRule{{Name: "c.test"}, {Name: "b.test"}},
		Headers: []egress.HeaderRule{{Domain: "B.test", Name: "authorization"}}}
	got, err = h.m.UpdateNetwork(ctx, listed.ID, keep)
	if err != nil || len(got.Network.Headers) != 1 || got.Network.Headers[0].Value != "Bearer s3cret" {
		t.Errorf("update keeping a header value: %+v, %v", got.Network, err)
	}
	if _, err := h.m.UpdateNetwork(ctx, listed.ID, egress.Policy{Domains: []egress.DomainRule{{Name: "d.test"}}, Headers: []egress.HeaderRule{{Domain: "d.test", Name: "X-Key"}}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("new header rule without a value: %v, want invalid argument", err)
	}
	// An empty mode keeps the current one, and no rules cut the sandbox off.
	got, err = h.m.UpdateNetwork(ctx, listed.ID, egress.Policy{})
	if err != nil || got.Network.Mode != egress.ModeAllowlist || hasRules(got.Network) {
		t.Errorf("emptying the allowlist: %+v, %v", got.Network, err)
	}
	// A store failure restores the live policy.
	h.store.failPut = func(Sandbox) error { return errors.New("disk full") }
	if _, err := h.m.UpdateNetwork(ctx, listed.ID, newPolicy); err == nil {
		t.Error("update with a failing store succeeded")
	}
	h.store.failPut = nil
	if p := fn.Policy(listed.ID); hasRules(p) {
		t.Errorf("live policy not restored after the store failed: %+v", p)
	}
	if sb, _ := h.m.Get(context.Background(), listed.ID); hasRules(sb.Network) {
		t.Errorf("sandbox policy not restored after the store failed: %+v", sb.Network)
	}
}

// TestNetworkReconcile restarts the Manager: kept sandboxes' networks are
// adopted with their stored policies, unknown networks removed, and a
// sandbox whose network vanished is marked as error.
func TestNetworkReconcile(t *testing.T) {
	h, fn := newNetHarness(t, nil)
	ctx := t.Context()
	kept, err := h.m.Create(ctx, Spec{Template: "tiny", Network: egress.Policy{Domains: []egress.DomainRule{{Name: "a.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	// A record from before rules had to name allowed domains: its stray
	// rule, which never applied, is dropped rather than failing adoption.
	stray := kept
	stray.Network.Headers = []egress.HeaderRule{{Domain: "elsewhere.test", Name: "X-Key", Value: "v"}}
	if err := h.store.PutSandbox(ctx, stray); err != nil {
		t.Fatal(err)
	}
	fn.Lose(lost.ID)
	fn.Plant("orphan", egress.Policy{Mode: egress.ModeOpen})
	if err := os.MkdirAll(filepath.Join(h.cfg.NetworkDir, "orphan"), 0o700); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	if diff := cmp.Diff([]string{kept.ID}, fn.IDs()); diff != "" {
		t.Errorf("networks after reconcile (-want +got):\n%s", diff)
	}
	if p := fn.Policy(kept.ID); len(p.Domains) != 1 || p.Domains[0].Name != "a.test" || len(p.Headers) != 0 {
		t.Errorf("adopted policy %+v", p)
	}
	if got, _ := h.m.Get(context.Background(), lost.ID); got.State != StateError {
		t.Errorf("sandbox without network is %s, want error", got.State)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.NetworkDir, "orphan")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphaned network files kept: %v", err)
	}
	// The kept sandbox still gets its proxy environment.
	if out := execOut(t, h, kept.ID, wire.ExecRequest{Shell: "echo $HTTP_PROXY"}); out != "http://10.99.0.1:15002\n" {
		t.Errorf("proxy environment after restart %q", out)
	}
	for _, id := range []string{kept.ID, lost.ID} {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertNetClean(t, h, fn)
	h.assertClean(t)
}

// TestNetworkSecretsAndTrustStore checks what a policy naming secrets
// gets: refusal of a secret the tenant does not have, placeholders in the
// environment of its processes that survive an update, and a trust store
// of the template's bundle plus the egress CA, mounted with the variables
// that point clients at it.
func TestNetworkSecretsAndTrustStore(t *testing.T) {
	store, err := secrets.New(secrets.NewMemStore(), make([]byte, secrets.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIfake\n-----END CERTIFICATE-----\n")
	h, fn := newNetHarness(t, func(c *Config) { c.Secrets, c.EgressCA = store, ca })
	ctx := tenancy.With(t.Context(), tenancy.Principal{Tenant: "team-a", Key: "a"})
	if _, err := h.m.CreateTemplate(ctx, "certs", "test", func(dir string) error {
		if err := os.MkdirAll(dir+"/etc/ssl/certs", 0o755); err != nil {
			return err
		}
		return os.WriteFile(dir+driver.CABundleDest, []byte("TEMPLATE ROOTS"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	policy := egress.Policy{Domains: []egress.DomainRule{{Name: "api.test"}},
		Headers:      []egress.HeaderRule{{Domain: "api.test", Name: "X-Key", Value: "{{secret:key}}"}},
		Placeholders: []egress.PlaceholderRule{{Domain: "api.test", Env: "API_KEY", Secret: "key"}}}
	if _, err := h.m.Create(ctx, Spec{Template: "certs", Network: policy}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("create naming an unknown secret: %v, want invalid argument", err)
	}
	if _, err := store.Create(ctx, "team-b", "key", "other tenant's"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Create(ctx, Spec{Template: "certs", Network: policy}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("create naming another tenant's secret: %v, want invalid argument", err)
	}
	if _, err := store.Create(ctx, "team-a", "key", "v4lue"); err != nil {
		t.Fatal(err)
	}
	sb, err := h.m.Create(ctx, Spec{Template: "certs", Network: policy})
	if err != nil {
		t.Fatal(err)
	}
	holder := sb.Network.Placeholders[0].Placeholder
	if !strings.HasPrefix(holder, egress.PlaceholderPrefix) || fn.Policy(sb.ID).Placeholders[0].Placeholder != holder {
		t.Fatalf("placeholder %q, network layer's %+v", holder, fn.Policy(sb.ID).Placeholders)
	}
	out := execOut(t, h, sb.ID, wire.ExecRequest{Shell: "echo $API_KEY $SSL_CERT_FILE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS"})
	if want := holder + " " + driver.CABundleDest + " " + driver.CABundleDest + " " + driver.CACertDest + "\n"; out != want {
		t.Errorf("environment %q, want %q", out, want)
	}
	spec, err := h.drv.Spec(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	bundle, _ := os.ReadFile(spec.Network.CABundle)
	cert, _ := os.ReadFile(spec.Network.CACert)
	if string(bundle) != "TEMPLATE ROOTS\n"+string(ca) || string(cert) != string(ca) {
		t.Errorf("trust store %q and CA %q", bundle, cert)
	}
	// An update that names the variable again keeps its stand-in; a new
	// variable gets one of its own, and an unknown secret is refused.
	policy.Placeholders = append(policy.Placeholders, egress.PlaceholderRule{Domain: "api.test", Env: "OTHER", Secret: "key"})
	got, err := h.m.UpdateNetwork(ctx, sb.ID, policy)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network.Placeholders[0].Placeholder != holder || got.Network.Placeholders[1].Placeholder == holder {
		t.Errorf("placeholders after update: %+v", got.Network.Placeholders)
	}
	if out := execOut(t, h, sb.ID, wire.ExecRequest{Shell: "echo $API_KEY $OTHER"}); out != holder+" "+got.Network.Placeholders[1].Placeholder+"\n" {
		t.Errorf("environment after update %q", out)
	}
	// A rule removed takes its variable with it from the next command on.
	if _, err := h.m.UpdateNetwork(ctx, sb.ID, egress.Policy{Domains: policy.Domains, Placeholders: policy.Placeholders[1:]}); err != nil {
		t.Fatal(err)
	}
	if out := execOut(t, h, sb.ID, wire.ExecRequest{Shell: "echo ${API_KEY-unset}"}); out != "unset\n" {
		t.Errorf("a removed placeholder's variable: %q", out)
	}
	bad := policy
	bad.Headers = []egress.HeaderRule{{Domain: "api.test", Name: "X-Key", Value: "{{secret:nosuch}}"}}
	if _, err := h.m.UpdateNetwork(ctx, sb.ID, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("update naming an unknown secret: %v, want invalid argument", err)
	}
	// A sandbox without a network route to the proxy gets no trust store.
	closed, err := h.m.Create(ctx, Spec{Template: "certs", Network: egress.Policy{Mode: egress.ModeNone}})
	if err != nil {
		t.Fatal(err)
	}
	if spec, _ := h.drv.Spec(closed.ID); spec.Network.CABundle != "" {
		t.Errorf("mode none got trust store %q", spec.Network.CABundle)
	}
	for _, id := range []string{sb.ID, closed.ID} {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertNetClean(t, h, fn)
}
