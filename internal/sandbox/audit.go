package sandbox

import (
	"context"
	"time"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/wire"
)

// Auditor keeps the audit log of commands started in sandboxes
// (audit.Log). Append must have stored the record when it returns nil.
type Auditor interface {
	Append(audit.Record) error
}

// AuditRecord returns a record of what the caller of ctx does: its tenant
// and key ("unix" for the root-only socket, "daemon" for the daemon's own
// work).
func AuditRecord(ctx context.Context, action, sandboxID string) audit.Record {
	r := audit.Record{Action: action, SandboxID: sandboxID, Key: "daemon"}
	if p, ok := tenancy.From(ctx); ok {
		r.Tenant, r.Key = p.Tenant, p.Key
		if r.Key == "" {
			r.Key = "unix"
		}
	}
	return r
}

// auditStart records a command before it starts; when the record cannot
// be stored the command does not run.
func (m *Manager) auditStart(ctx context.Context, action, id string, req wire.ExecRequest) (audit.Record, error) {
	r := AuditRecord(ctx, action, id)
	if m.cfg.Audit == nil {
		return r, nil
	}
	r.Argv = req.Cmd
	if req.Shell != "" {
		r.Argv = []string{"/bin/sh", "-c", req.Shell}
	}
	if err := m.cfg.Audit.Append(r); err != nil {
		return r, errdefs.Errorf(errdefs.ErrUnavailable, "the audit log cannot be written, so no command starts: %v", err)
	}
	return r, nil
}

// auditEnd records how a command that auditStart recorded ended: its exit
// event, or err.
func (m *Manager) auditEnd(r audit.Record, start time.Time, exit *wire.ExecEvent, err error) {
	if m.cfg.Audit == nil {
		return
	}
	r.Time, r.Argv = time.Time{}, nil
	r.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	switch {
	case err != nil:
		r.Error = err.Error()
	case exit != nil:
		r.ExitCode, r.Signal = exit.ExitCode, exit.Signal
	}
	if err := m.cfg.Audit.Append(r); err != nil {
		m.log.Error("recording the end of a command in the audit log", "sandbox_id", r.SandboxID, "err", err)
	}
}
