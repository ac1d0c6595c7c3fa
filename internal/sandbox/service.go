package sandbox

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// Bounds of a template service's ready wait.
const (
	// DefaultReadyTimeout is how long a create waits for a service whose
	// template names no ready timeout.
	DefaultReadyTimeout = 60 * time.Second
	// MaxReadyTimeout is the longest ready timeout a template may ask for.
	MaxReadyTimeout = 30 * time.Minute
)

// RangeReadyTimeout bounds Service.ReadyTimeoutMS.
var RangeReadyTimeout = Range{Field: "ready_timeout_ms", Unit: "milliseconds", Min: 0, Max: int64(MaxReadyTimeout / time.Millisecond), Scale: 1}

// ValidateService checks a template service; nil is valid (no service).
// Errors wrap errdefs.ErrInvalidArgument and name the field.
func ValidateService(sv *Service) error {
	if sv == nil {
		return nil
	}
	switch {
	case len(sv.Cmd) == 0 && sv.Shell == "":
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: a start command (cmd or shell) is required")
	case len(sv.Cmd) > 0 && sv.Shell != "":
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: cmd and shell are exclusive")
	case len(sv.Cmd) > 0 && sv.Cmd[0] == "":
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: cmd[0] (the program) is empty")
	}
	switch sv.Restart {
	case "", wire.RestartNever, wire.RestartOnFailure, wire.RestartAlways:
	default:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: restart %q: want %s, %s or %s",
			sv.Restart, wire.RestartNever, wire.RestartOnFailure, wire.RestartAlways)
	}
	if err := RangeReadyTimeout.Check(sv.ReadyTimeoutMS); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	return validateReady(sv.Ready)
}

// validateReady checks that a ready check names exactly one condition,
// and that one well.
func validateReady(r *wire.ReadyCheck) error {
	if r == nil {
		return nil
	}
	n := 0
	for _, set := range []bool{len(r.Cmd) > 0, r.Shell != "", r.Port != 0, r.URL != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: a ready check takes exactly one of cmd, shell, port and url (got %d)", n)
	}
	if r.Port < 0 || r.Port > 65535 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: ready port %d: want 1 to 65535", r.Port)
	}
	if r.IntervalMS < 0 || r.IntervalMS > int64(time.Minute/time.Millisecond) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: ready interval_ms %d: want 0 to 60000", r.IntervalMS)
	}
	if r.URL != "" {
		u, err := url.Parse(r.URL)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "service: ready url %q: want an http:// URL with a host", r.URL)
		}
	}
	return nil
}

// SetTemplateService replaces the service of template name (nil removes
// it). Sandboxes made after the call start the new service; running ones
// keep what they run.
func (m *Manager) SetTemplateService(ctx context.Context, name string, sv *Service) (Template, error) {
	if err := ValidateService(sv); err != nil {
		return Template{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t, err := m.templateToChange(ctx, name)
	if err != nil {
		return Template{}, err
	}
	t = t.clone()
	t.Service = nil
	if sv != nil {
		t.Service = Template{Service: sv}.clone().Service
	}
	if err := m.cfg.Store.PutTemplate(ctx, t); err != nil {
		return Template{}, fmt.Errorf("recording template %q: %w", name, err)
	}
	m.templates[name] = t
	return t.clone(), nil
}
