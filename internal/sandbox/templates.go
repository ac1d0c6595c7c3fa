package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/snapshotdir"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/wire"
)

// Defaults say how processes run in the sandboxes of a template, as the
// configuration of the image it came from says: Env is the base
// environment ("NAME=value"), WorkingDir the directory and User the user
// a process gets when its request names none. Entrypoint, Cmd and Labels
// are kept for clients; sandboxes do not run them by themselves.
//
// The JSON shape is that of ociimage.Defaults, which converts to it
// directly; this package does not import package ociimage.
type Defaults struct {
	Env        []string          `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// clone returns a deep copy, so callers never share slices or maps with
// the Manager.
func (t Template) clone() Template {
	t.BuildKeys = slices.Clone(t.BuildKeys)
	t.ReadySnapshots = maps.Clone(t.ReadySnapshots)
	if t.Defaults != nil {
		d := *t.Defaults
		d.Env = slices.Clone(d.Env)
		d.Entrypoint = slices.Clone(d.Entrypoint)
		d.Cmd = slices.Clone(d.Cmd)
		d.Labels = maps.Clone(d.Labels)
		t.Defaults = &d
	}
	if t.Service != nil {
		sv := *t.Service
		sv.Cmd = slices.Clone(sv.Cmd)
		if sv.Ready != nil {
			r := *sv.Ready
			r.Cmd = slices.Clone(r.Cmd)
			sv.Ready = &r
		}
		t.Service = &sv
	}
	return t
}

// withDefaults fills in what req leaves to the sandbox sb and its
// template. The environment is layered by name: the template's Env, then
// the sandbox's environment, then req.Env. Cwd and User take the
// template's WorkingDir and User when req leaves them empty (so a request
// that wants root in a template whose user is someone else says "root").
// The caller holds m.mu.
func (m *Manager) withDefaults(sb Sandbox, req *wire.ExecRequest) {
	var d *Defaults
	if t, ok := m.templates[sb.Template]; ok {
		d = t.Defaults
	}
	if d == nil && len(sb.Env) == 0 {
		return
	}
	env := make(map[string]string, len(sb.Env)+len(req.Env))
	if d != nil {
		for _, kv := range d.Env {
			// Image configs hold "NAME=value"; a bare "NAME" has no value
			// to pass on.
			if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
				env[k] = v
			}
		}
		if req.Cwd == "" {
			req.Cwd = d.WorkingDir
		}
		if req.User == "" {
			req.User = d.User
		}
	}
	maps.Copy(env, sb.Env)
	maps.Copy(env, req.Env)
	req.Env = env
}

// ValidateTemplateName reports whether name can name a template: lower-case
// letters, digits, '.', '_' and '-', starting with a letter or digit, at
// most 63 characters.
func ValidateTemplateName(name string) error {
	ok := len(name) > 0 && len(name) <= 63
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			ok = false
		}
	}
	if !ok {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid template name %q: use lower-case letters, digits, '.', '_' and '-'", name)
	}
	return nil
}

// templateSeen reports whether the caller of ctx sees template t: the
// operator's templates are everyone's, a tenant's are its own and the
// admins'.
func templateSeen(ctx context.Context, t Template) bool {
	return t.Tenant == "" || tenancy.Sees(ctx, t.Tenant)
}

// templateOf returns template name as the caller of ctx may use it:
// another tenant's is not found, as an unknown one. The caller holds m.mu.
func (m *Manager) templateOf(ctx context.Context, name string) (Template, error) {
	t, ok := m.templates[name]
	if !ok || !templateSeen(ctx, t) {
		return Template{}, errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", name)
	}
	return t, nil
}

// templateToChange is templateOf for a change of the template (delete,
// service, ready snapshots): a tenant changes its own templates only; the
// operator's, which it sees and uses, answer permission_denied, as the
// other objects every tenant shares (pools). The caller holds m.mu.
func (m *Manager) templateToChange(ctx context.Context, name string) (Template, error) {
	t, err := m.templateOf(ctx, name)
	if err == nil && !tenancy.Sees(ctx, t.Tenant) {
		err = errdefs.Errorf(errdefs.ErrPermissionDenied, "template %q is the operator's, shared by every tenant: only admin keys change it", name)
	}
	return t, err
}

// CreateTemplate makes a template named name by calling fill on an empty
// directory, and records it. Names are lower-case letters, digits, '.', '_'
// and '-', at most 63 characters. The template belongs to the caller's
// tenant (tenancy.Owner). Names are one namespace for every tenant: a
// name another tenant took is already_exists, which does not say whose.
func (m *Manager) CreateTemplate(ctx context.Context, name, source string, fill func(dir string) error) (Template, error) {
	return m.CreateTemplateFrom(ctx, Template{Name: name, Source: source}, fill)
}

// CreateTemplateFrom is CreateTemplate for a record that says more than a
// name and a source (image, digest, defaults); its CreatedAt and Tenant
// are set here.
func (m *Manager) CreateTemplateFrom(ctx context.Context, t Template, fill func(dir string) error) (Template, error) {
	name := t.Name
	if err := ValidateTemplateName(name); err != nil {
		return Template{}, err
	}
	if err := ValidateService(t.Service); err != nil {
		return Template{}, err
	}
	m.mu.RLock()
	_, exists := m.templates[name]
	m.mu.RUnlock()
	if exists {
		return Template{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "template %q already exists", name)
	}
	prepared := func(dir string) error {
		if err := fill(dir); err != nil {
			return err
		}
		for _, d := range m.drivers {
			if p, ok := d.(driver.TemplatePreparer); ok {
				if err := p.PrepareTemplate(dir); err != nil {
					return fmt.Errorf("preparing template %q for %s: %w", name, d.Name(), err)
				}
			}
		}
		return nil
	}
	if err := m.cfg.Storage.CreateTemplate(ctx, name, prepared); err != nil {
		return Template{}, fmt.Errorf("creating template %q: %w", name, err)
	}
	t = t.clone()
	t.CreatedAt, t.Tenant = m.cfg.Now().UTC(), tenancy.Owner(ctx)
	if err := m.cfg.Store.PutTemplate(ctx, t); err != nil {
		if derr := m.cfg.Storage.DeleteTemplate(context.WithoutCancel(ctx), name); derr != nil {
			m.log.Error("rolling back template", "template", name, "err", derr)
		}
		return Template{}, fmt.Errorf("recording template %q: %w", name, err)
	}
	m.mu.Lock()
	m.templates[name] = t
	m.mu.Unlock()
	return t.clone(), nil
}

// DeleteTemplate removes a template that no sandbox uses, and its ready
// snapshots with it. A tenant deletes its own templates only
// (templateToChange).
func (m *Manager) DeleteTemplate(ctx context.Context, name string) error {
	m.mu.RLock()
	_, err := m.templateToChange(ctx, name)
	m.mu.RUnlock()
	if err != nil {
		return err
	}
	if err := m.checkNoPoolUses(name); err != nil {
		return err
	}
	m.mu.Lock()
	if _, err := m.templateToChange(ctx, name); err != nil {
		m.mu.Unlock()
		return err
	}
	users := map[string]string{}
	for id, e := range m.sandboxes {
		if e.sb.Template == name {
			users[id] = e.sb.Tenant
		}
	}
	if len(users) > 0 {
		m.mu.Unlock()
		return usedBy(ctx, name, "sandbox(es)", users)
	}
	if snaps := m.snapshotUsers(name); len(snaps) > 0 {
		m.mu.Unlock()
		return usedBy(ctx, name, "snapshot(s)", snaps)
	}
	t := m.templates[name]
	delete(m.templates, name)
	m.mu.Unlock()
	if err := m.dropReadyOf(ctx, t); err != nil {
		m.mu.Lock()
		m.templates[name] = t
		m.mu.Unlock()
		return fmt.Errorf("deleting template %q: %w", name, err)
	}
	if err := m.cfg.Storage.DeleteTemplate(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("deleting template %q: %w", name, err)
	}
	if err := m.cfg.Store.DeleteTemplate(ctx, name); err != nil {
		return fmt.Errorf("forgetting template %q: %w", name, err)
	}
	return nil
}

// usedBy is the refusal to delete template name while users (sandboxes or
// snapshots, by name, with their tenants) hold it. It names the users the
// caller of ctx sees and only counts the others, whose names are other
// tenants' to know.
func usedBy(ctx context.Context, name, what string, users map[string]string) error {
	var seen []string
	for u, tenant := range users {
		if tenancy.Sees(ctx, tenant) {
			seen = append(seen, u)
		}
	}
	slices.Sort(seen)
	list := strings.Join(seen, ", ")
	if others := len(users) - len(seen); others > 0 {
		list = strings.TrimPrefix(fmt.Sprintf("%s, %d of other tenants", list, others), ", ")
	}
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %q is used by %d %s: %s", name, len(users), what, list)
}

// Templates lists the templates the caller of ctx sees, by name: the
// operator's and its tenant's own (every one for admins and the daemon).
func (m *Manager) Templates(ctx context.Context) []Template {
	m.mu.RLock()
	out := make([]Template, 0, len(m.templates))
	for _, t := range m.templates {
		if templateSeen(ctx, t) {
			out = append(out, t.clone())
		}
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Template returns one template the caller of ctx sees; another tenant's
// is not found, as an unknown one.
func (m *Manager) Template(ctx context.Context, name string) (Template, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	t, err := m.templateOf(ctx, name)
	if err != nil {
		return Template{}, err
	}
	return t.clone(), nil
}

// TemplateExists reports whether any tenant's template is named name:
// names are one namespace, so a new template's name is checked against
// all of them.
func (m *Manager) TemplateExists(name string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.templates[name]
	return ok
}

// CopyTemplateTree copies the files of template name into dir, an
// existing empty directory, as they are stored (a build that starts from
// the template copies them so). Owners come out as stored, shifted into
// the sandbox range where the driver shifts templates. The copy clones
// extents on filesystems that share them.
func (m *Manager) CopyTemplateTree(ctx context.Context, name, dir string) error {
	if _, err := m.Template(ctx, name); err != nil {
		return err
	}
	if err := snapshotdir.CopyTree(ctx, m.cfg.Storage.TemplatePath(name), dir); err != nil {
		return fmt.Errorf("copying template %q: %w", name, err)
	}
	return nil
}
