package sandbox

import (
	"maps"
	"slices"
	"strings"

	"github.com/corralrun/corral/internal/wire"
)

// Defaults say how processes run in the sandboxes of a template, as the
// configuration of the image it came from says: Env is the base
// environment ("NAME=value"), WorkingDir the directory and User the user
// a process gets when its request names none. Entrypoint, Cmd and Labels
// are kept for clients; sandboxes do not run them by themselves.
//
// The JSON shape is that of image.Defaults, which converts to it
// directly; this package does not import package image.
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
	if t.Defaults != nil {
		d := *t.Defaults
		d.Env = slices.Clone(d.Env)
		d.Entrypoint = slices.Clone(d.Entrypoint)
		d.Cmd = slices.Clone(d.Cmd)
		d.Labels = maps.Clone(d.Labels)
		t.Defaults = &d
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
