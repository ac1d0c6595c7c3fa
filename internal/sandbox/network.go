package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/network"
	"github.com/corralrun/corral/internal/wire"
)

// Network gives sandboxes network namespaces prepared on the host and
// enforces their egress policies there. *network.Manager implements it.
type Network interface {
	Setup(ctx context.Context, id string, p egress.Policy) (*network.Sandbox, error)
	Update(ctx context.Context, id string, p egress.Policy) error
	Teardown(ctx context.Context, id string) error
	Get(id string) (network.Sandbox, bool)
	Reconcile(ctx context.Context, keep map[string]egress.Policy) error
}

var _ Network = (*network.Manager)(nil)

// Files in a sandbox's directory under Config.NetworkDir, bind-mounted
// read-only over /etc/resolv.conf and /etc/hosts.
const (
	resolvConfFile = "resolv.conf"
	hostsFile      = "hosts"
)

// teardownTimeout bounds one background network teardown.
const teardownTimeout = time.Minute

// Files of the sandbox's trust store in its directory under
// Config.NetworkDir (see Config.EgressCA).
const (
	caBundleFile = "ca-bundle.crt"
	caCertFile   = "egress-ca.pem"
)

// SecretLookup tells whether a tenant's secret exists (*secrets.Store).
// Value's error wraps errdefs.ErrNotFound for a secret that does not.
type SecretLookup interface {
	Value(ctx context.Context, tenant, name string) (string, error)
}

// hasRules reports whether p names any domain, CIDR, header or
// placeholder rule.
func hasRules(p egress.Policy) bool {
	return len(p.Domains)+len(p.CIDRs)+len(p.Headers)+len(p.Placeholders) > 0
}

// checkSecrets refuses a policy that names a secret tenant does not have.
func (m *Manager) checkSecrets(ctx context.Context, tenant string, p egress.Policy) error {
	refs := p.SecretRefs()
	if len(refs) == 0 {
		return nil
	}
	if m.cfg.Secrets == nil {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "egress rules name secrets, and this daemon has no secret store")
	}
	for _, name := range refs {
		if _, err := m.cfg.Secrets.Value(ctx, tenant, name); errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "egress rules name secret %q, which does not exist (corral secret create %s)", name, name)
		} else if err != nil {
			return fmt.Errorf("looking up secret %q: %w", name, err)
		}
	}
	return nil
}

// assignPlaceholders gives each placeholder rule of p without one a new
// stand-in value, the same for every rule of one environment variable.
// Values old already has for a variable are kept, so that an update leaves
// the stand-ins processes hold valid.
func assignPlaceholders(p *egress.Policy, old egress.Policy) error {
	byEnv := map[string]string{}
	for _, r := range old.Placeholders {
		byEnv[r.Env] = r.Placeholder
	}
	for _, r := range p.Placeholders {
		if r.Placeholder != "" {
			byEnv[r.Env] = r.Placeholder
		}
	}
	p.Placeholders = slices.Clone(p.Placeholders)
	for i, r := range p.Placeholders {
		if r.Placeholder != "" {
			continue
		}
		v, ok := byEnv[r.Env]
		if !ok {
			var b [16]byte
			if _, err := rand.Read(b[:]); err != nil {
				return err
			}
			v = egress.PlaceholderPrefix + hex.EncodeToString(b[:])
			byEnv[r.Env] = v
		}
		p.Placeholders[i].Placeholder = v
	}
	return nil
}

// placeholderEnv is the environment a sandbox with policy p holds its
// placeholders in. It is added per command (withNetworkEnv), from the
// policy of the moment, so that an update's new variables reach the next
// command and a removed rule's variable does not.
func placeholderEnv(p egress.Policy) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range p.Placeholders {
		if !seen[r.Env] {
			seen[r.Env] = true
			out = append(out, r.Env+"="+r.Placeholder)
		}
	}
	return out
}

// trustEnv points the TLS clients that ignore the system trust store, or
// read only their own, at the sandbox's (see Config.EgressCA).
var trustEnv = []string{
	"SSL_CERT_FILE=" + driver.CABundleDest,
	"REQUESTS_CA_BUNDLE=" + driver.CABundleDest,
	"CURL_CA_BUNDLE=" + driver.CABundleDest,
	"NODE_EXTRA_CA_CERTS=" + driver.CACertDest,
}

// networkEnv is the environment sandbox id's processes get from its
// network: the proxy variables, and trustEnv where its trust store is
// mounted.
func (m *Manager) networkEnv(id string, ns network.Sandbox) []string {
	env := ns.ProxyEnv()
	if _, err := os.Stat(filepath.Join(m.cfg.NetworkDir, id, caCertFile)); err == nil {
		env = append(env, trustEnv...)
	}
	return env
}

// writeTrustStore writes into dir the trust store of a sandbox of
// template: the template's bundle at driver.CABundleDest (read inside
// the template's tree, never following a link out of it; none when the
// template has none) followed by Config.EgressCA, and the CA alone.
func (m *Manager) writeTrustStore(dir, template string) error {
	var bundle []byte
	if root, err := os.OpenRoot(m.cfg.Storage.TemplatePath(template)); err == nil {
		bundle, err = root.ReadFile(strings.TrimPrefix(driver.CABundleDest, "/"))
		root.Close()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("reading the trust store of template %s: %w", template, err)
		}
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, m.cfg.EgressCA...)
	if err := os.WriteFile(filepath.Join(dir, caBundleFile), bundle, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, caCertFile), m.cfg.EgressCA, 0o644)
}

// resolvePolicy fills an empty mode with mode (allowlist instead of none
// when p has rules, which none cannot take), gives placeholder rules their
// stand-ins (keeping those of old, the policy p replaces) and normalizes
// p. Modes other than none need Config.Network.
func (m *Manager) resolvePolicy(p egress.Policy, mode egress.Mode, old egress.Policy) (egress.Policy, error) {
	if err := assignPlaceholders(&p, old); err != nil {
		return egress.Policy{}, err
	}
	if p.Mode == "" {
		p.Mode = mode
		if hasRules(p) && mode == egress.ModeNone {
			p.Mode = egress.ModeAllowlist
		}
	}
	p, err := p.Normalize()
	if err != nil {
		return egress.Policy{}, err
	}
	if p.Mode != egress.ModeNone && m.cfg.Network == nil {
		return egress.Policy{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "network mode %s: this daemon runs without network support", p.Mode)
	}
	return p, nil
}

// clonePolicy returns a deep copy of p.
func clonePolicy(p egress.Policy) egress.Policy {
	p.Domains = slices.Clone(p.Domains)
	for i := range p.Domains {
		p.Domains[i].Ports = slices.Clone(p.Domains[i].Ports)
	}
	p.CIDRs = slices.Clone(p.CIDRs)
	for i := range p.CIDRs {
		p.CIDRs[i].Ports = slices.Clone(p.CIDRs[i].Ports)
	}
	p.Headers = slices.Clone(p.Headers)
	p.Placeholders = slices.Clone(p.Placeholders)
	return p
}

// managedNetwork reports whether sb's network is one of Config.Network's:
// a record without a mode ran in the runtime's own namespace, which the
// Manager neither updates nor tears down.
func (m *Manager) managedNetwork(sb Sandbox) bool {
	return m.cfg.Network != nil && sb.Network.Mode != ""
}

// setupNetwork prepares sandbox sb's network namespace under its policy
// and writes its resolv.conf and hosts files, and its trust store when it
// may reach the egress proxy (Config.EgressCA). It returns what the driver
// needs (nil without Config.Network). On failure nothing is left.
func (m *Manager) setupNetwork(ctx context.Context, sb Sandbox) (*driver.Network, error) {
	if !m.managedNetwork(sb) {
		return nil, nil
	}
	ns, err := m.cfg.Network.Setup(ctx, sb.ID, sb.Network)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(m.cfg.NetworkDir, sb.ID)
	hosts := "127.0.0.1\tlocalhost\n127.0.1.1\t" + sb.ID + "\n"
	err = os.MkdirAll(dir, 0o700)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, resolvConfFile), []byte(ns.ResolvConf()), 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, hostsFile), []byte(hosts), 0o644)
	}
	trust := m.cfg.EgressCA != nil && sb.Network.Mode != egress.ModeNone
	if err == nil && trust {
		err = m.writeTrustStore(dir, sb.Template)
	}
	if err != nil {
		err = fmt.Errorf("writing name service and trust store files of sandbox %s: %w", sb.ID, err)
		return nil, errors.Join(err, m.releaseNetwork(context.WithoutCancel(ctx), sb.ID))
	}
	n := &driver.Network{
		NetNSPath:  ns.NetNSPath,
		ResolvConf: filepath.Join(dir, resolvConfFile),
		Hosts:      filepath.Join(dir, hostsFile),
		Env:        m.networkEnv(sb.ID, *ns),
	}
	if trust {
		n.CABundle, n.CACert = filepath.Join(dir, caBundleFile), filepath.Join(dir, caCertFile)
	}
	return n, nil
}

// releaseNetwork tears down sandbox id's network and removes its files.
// It is idempotent.
func (m *Manager) releaseNetwork(ctx context.Context, id string) error {
	if m.cfg.Network == nil {
		return nil
	}
	err := m.cfg.Network.Teardown(ctx, id)
	if rerr := os.RemoveAll(filepath.Join(m.cfg.NetworkDir, id)); rerr != nil {
		err = errors.Join(err, fmt.Errorf("removing name service files of sandbox %s: %w", id, rerr))
	}
	return err
}

// releaseNetworkLater tears down the network of a deleted sandbox in the
// background. Teardown waits for kernel RCU grace periods (package
// network), which a client deleting a sandbox need not wait for:
// the sandbox is gone from the API already, its processes are dead, and
// its address stays reserved until the teardown ends. Close waits for
// pending teardowns; after a crash, reconcile removes what is left.
func (m *Manager) releaseNetworkLater(id string) {
	m.bgMu.Lock()
	defer m.bgMu.Unlock()
	if m.bgClosed {
		ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
		defer cancel()
		if err := m.releaseNetwork(ctx, id); err != nil {
			m.log.Error("tearing down network", "sandbox_id", id, "err", err)
		}
		return
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
		defer cancel()
		if err := m.releaseNetwork(ctx, id); err != nil {
			m.log.Error("tearing down network", "sandbox_id", id, "err", err)
		}
	}()
}

// waitBackground stops accepting background work and waits for what is
// running.
func (m *Manager) waitBackground() {
	m.bgMu.Lock()
	m.bgClosed = true
	m.bgMu.Unlock()
	m.bg.Wait()
}

// UpdateNetwork replaces a running or paused sandbox's network policy and
// returns the sandbox. The new policy takes effect at once for new DNS
// queries and connections; connections already open keep running. An
// empty Mode keeps the current mode. Switching to or from mode none fails
// with errdefs.ErrFailedPrecondition (it needs a new sandbox), as does a
// sandbox without a managed network.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, p egress.Policy) (Sandbox, error) {
	e, _, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	m.mu.RLock()
	old := clonePolicy(e.sb.Network)
	state := e.sb.State
	managed := m.managedNetwork(e.sb)
	tenant, pooled := e.sb.Tenant, e.sb.Pool != ""
	m.mu.RUnlock()
	if state != StateRunning && state != StatePaused {
		return Sandbox{}, notRunning(id, state)
	}
	if !managed {
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s has no managed network (made before network support)", id)
	}
	p, err = m.resolvePolicy(p, old.Mode, old)
	if err != nil {
		return Sandbox{}, err
	}
	if err := keepHeaderValues(&p, old); err != nil {
		return Sandbox{}, err
	}
	// A pool member being claimed takes the policy its claimer's create
	// checked already, for the claimer's tenant.
	if !pooled {
		if err := m.checkSecrets(ctx, tenant, p); err != nil {
			return Sandbox{}, err
		}
	}
	if err := m.cfg.Network.Update(ctx, id, p); err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	e.sb.Network = p
	sb := e.sb.clone()
	m.mu.Unlock()
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		// Keep the host and the record in agreement: the old policy is
		// what a restarted daemon would apply.
		rctx := context.WithoutCancel(ctx)
		if rerr := m.cfg.Network.Update(rctx, id, old); rerr != nil {
			m.log.Error("restoring network policy", "sandbox_id", id, "err", rerr)
		}
		m.mu.Lock()
		e.sb.Network = old
		m.mu.Unlock()
		return Sandbox{}, fmt.Errorf("recording network policy of sandbox %s: %w", id, err)
	}
	m.log.Info("network policy updated", "sandbox_id", id, "mode", string(p.Mode),
		"domains", len(p.Domains), "cidrs", len(p.CIDRs), "headers", len(p.Headers), "placeholders", len(p.Placeholders))
	return sb, nil
}

// withNetworkEnv adds the environment of the sandbox's network (HTTP_PROXY
// and friends, the trust store's variables and the placeholders of its
// policy) to req under every other layer, so the
// template, the sandbox and the request can override it. The caller holds
// m.mu.
func withNetworkEnv(e *entry, req *wire.ExecRequest) {
	holders := placeholderEnv(e.sb.Network)
	if len(e.netEnv)+len(holders) == 0 {
		return
	}
	env := make(map[string]string, len(e.netEnv)+len(holders)+len(req.Env))
	for _, kv := range slices.Concat(e.netEnv, holders) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	maps.Copy(env, req.Env)
	req.Env = env
}

// reconcileNetworks adopts the networks of the sandboxes reconcile kept
// and removes every other one (Network.Reconcile), then marks kept
// sandboxes whose network is gone as errored, and removes name service
// files nobody uses. Called by reconcile, before anything else runs.
func (m *Manager) reconcileNetworks(ctx context.Context) error {
	if m.cfg.Network == nil {
		return nil
	}
	keep := map[string]egress.Policy{}
	for id, e := range m.sandboxes {
		if p, dropped := e.sb.Network.WithoutStrayRules(); len(dropped) > 0 {
			m.log.Warn("dropping header and placeholder rules for domains the sandbox's policy does not allow; they never applied",
				"sandbox_id", id, "domains", strings.Join(dropped, ","))
			e.sb.Network = p
		}
		if m.managedNetwork(e.sb) && e.sb.State != StateStopped {
			keep[id] = e.sb.Network
		}
	}
	if err := m.cfg.Network.Reconcile(ctx, keep); err != nil {
		m.log.Warn("reconciling networks", "err", err)
	}
	for id := range keep {
		e := m.sandboxes[id]
		ns, ok := m.cfg.Network.Get(id)
		if ok {
			e.netEnv = m.networkEnv(id, ns)
			continue
		}
		if e.sb.State == StateError {
			continue
		}
		m.log.Warn("sandbox network is gone; marking the sandbox as error", "sandbox_id", id)
		cause := errors.New("the sandbox's network is gone from the host; delete the sandbox")
		if _, err := m.transition(ctx, e, move{to: StateError, cause: cause}); err != nil {
			return err
		}
	}
	dirs, err := os.ReadDir(m.cfg.NetworkDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("listing network files: %w", err)
	}
	for _, d := range dirs {
		if _, ok := m.sandboxes[d.Name()]; !ok {
			if err := os.RemoveAll(filepath.Join(m.cfg.NetworkDir, d.Name())); err != nil {
				return fmt.Errorf("removing network files of %s: %w", d.Name(), err)
			}
		}
	}
	return nil
}

// keepHeaderValues fills the header rules of p that carry no value with
// the value of old's rule for the same domain and header: the API never
// returns a value, so a client that changes other parts of a policy sends
// the rules back without one.
func keepHeaderValues(p *egress.Policy, old egress.Policy) error {
	for i, h := range p.Headers {
		if h.Value != "" {
			continue
		}
		j := slices.IndexFunc(old.Headers, func(o egress.HeaderRule) bool {
			return o.Domain == h.Domain && strings.EqualFold(o.Name, h.Name)
		})
		if j < 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "header rule %s for %q has no value, and the sandbox has none to keep", h.Name, h.Domain)
		}
		p.Headers[i].Value = old.Headers[j].Value
	}
	return nil
}
