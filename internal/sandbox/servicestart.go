package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// serviceGrace is how much longer than a service's ready timeout the
// Manager waits for the agent's answer, so that the agent's own verdict,
// which carries the start command's output, normally arrives first.
const serviceGrace = 5 * time.Second

// serviceToStart returns a copy of the service a new instance of template
// name must start before its sandbox turns running, or nil: none when the
// template has no service, and none when the instance continues from src's
// memory, whose processes (the service among them) run already.
func (m *Manager) serviceToStart(name string, src *restoreSource) *Service {
	if src != nil && src.memory {
		return nil
	}
	m.mu.RLock()
	t, ok := m.templates[name]
	m.mu.RUnlock()
	if !ok || t.Service == nil {
		return nil
	}
	return t.clone().Service
}

// serviceRequest is the agent request that starts sv in sandbox sb, whose
// network gives its processes netEnv: the start command runs with the
// environment, directory and user an exec without its own would get
// (execDefaults). The caller holds m.mu for reading.
func (m *Manager) serviceRequest(sb Sandbox, netEnv []string, sv *Service) wire.ServiceRequest {
	start := wire.ExecRequest{Cmd: sv.Cmd, Shell: sv.Shell}
	m.execDefaults(&entry{sb: sb, netEnv: netEnv}, &start)
	timeout := sv.ReadyTimeoutMS
	if timeout == 0 {
		timeout = DefaultReadyTimeout.Milliseconds()
	}
	return wire.ServiceRequest{Start: start, Restart: sv.Restart, Ready: sv.Ready, ReadyTimeoutMS: timeout}
}

// startService starts service sv of sandbox sb's template through the
// sandbox's agent ag and waits, within ctx, until it is ready. A service
// that does not become ready is errdefs.ErrFailedPrecondition naming the
// template, with the agent's account (the start command's last output);
// the caller's undo removes the instance and with it the service's
// processes. A nil sv starts nothing.
func (m *Manager) startService(ctx context.Context, ag *agentclient.Client, sb Sandbox, netEnv []string, sv *Service) error {
	if sv == nil {
		return nil
	}
	m.mu.RLock()
	req := m.serviceRequest(sb, netEnv, sv)
	m.mu.RUnlock()
	wait := time.Duration(req.ReadyTimeoutMS)*time.Millisecond + serviceGrace
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	begin := time.Now()
	st, err := ag.StartService(wctx, req)
	switch {
	case err == nil:
		m.log.Info("sandbox service ready", "sandbox_id", sb.ID, "template", sb.Template, "pid", st.PID,
			"duration_ms", time.Since(begin).Milliseconds())
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("starting service of sandbox %s: %w", sb.ID, ctx.Err())
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %q: service not ready: %v", sb.Template, err)
	case wctx.Err() != nil:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %q: service not ready: the agent of sandbox %s did not answer within %s",
			sb.Template, sb.ID, wait)
	}
	return fmt.Errorf("template %q: starting service of sandbox %s: %w", sb.Template, sb.ID, err)
}

// ServiceStatus describes the service of running sandbox id, as its agent
// sees it: its state, process, restarts and, when it is not ready, why and
// its last output. A sandbox whose instance runs no service (its template
// had none when it started) is errdefs.ErrNotFound; one that is not
// running (stopped, paused, starting) is errdefs.ErrFailedPrecondition.
// It is not activity for the idle timeout.
func (m *Manager) ServiceStatus(ctx context.Context, id string) (wire.ServiceStatus, error) {
	e, err := m.entry(ctx, id)
	if err != nil {
		return wire.ServiceStatus{}, err
	}
	m.mu.RLock()
	sb, ag := e.sb, e.agent
	m.mu.RUnlock()
	if sb.Pool != "" {
		return wire.ServiceStatus{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if sb.State != StateRunning || ag == nil {
		return wire.ServiceStatus{}, notRunning(id, sb.State)
	}
	st, err := ag.Service(ctx)
	if errors.Is(err, errdefs.ErrNotFound) {
		return wire.ServiceStatus{}, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s runs no service (template %q had none when it started)", id, sb.Template)
	}
	if err != nil {
		return wire.ServiceStatus{}, fmt.Errorf("describing service of sandbox %s: %w", id, err)
	}
	return st, nil
}

// netEnvOf is the proxy environment of network n, nil without one.
func netEnvOf(n *driver.Network) []string {
	if n == nil {
		return nil
	}
	return n.Env
}
