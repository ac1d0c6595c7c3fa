package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/tenancy"
	"github.com/corralrun/corral/internal/wire"
)

// Agent returns the agent client of a running sandbox, for file
// operations. The client stays owned by the Manager.
func (m *Manager) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok || e.sb.Pool != "" || !tenancy.Sees(ctx, e.sb.Tenant) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if e.sb.State != StateRunning || e.agent == nil {
		return nil, notRunning(id, e.sb.State)
	}
	e.act.touch(m.cfg.Now())
	return e.agent, nil
}

// Exec runs a process in a running sandbox and calls fn for each event. The
// sandbox's environment is the base of the process's; req.Env overrides it.
// When a process dies of SIGKILL and the sandbox's OOM-kill count rose
// meanwhile, the exit event says OOMKilled.
func (m *Manager) Exec(ctx context.Context, id string, req wire.ExecRequest, fn func(wire.ExecEvent) error) error {
	e, client, runtime, err := m.running(ctx, id, &req)
	if err != nil {
		return err
	}
	if err := m.checkExec(&req); err != nil {
		return err
	}
	rec, err := m.auditStart(ctx, "exec", id, req)
	if err != nil {
		return err
	}
	start := time.Now()
	var exit *wire.ExecEvent
	seen := func(ev wire.ExecEvent) error {
		if ev.Type == wire.EventExit {
			exit = &ev
		}
		return fn(ev)
	}
	before, oomErr := oomKills(ctx, m.drivers[runtime], id)
	err = m.exec(ctx, execTarget{e: e, id: id, runtime: runtime, client: client}, req, before, oomErr, seen)
	m.auditEnd(rec, start, exit, err)
	if errors.Is(err, errdefs.ErrUnavailable) {
		m.checkAlive(context.WithoutCancel(ctx), e)
	}
	return err
}

// checkExec checks req's numeric fields against their ranges and its
// output limit against the server's, and sets the default limit where
// req has none.
func (m *Manager) checkExec(req *wire.ExecRequest) error {
	if err := execRanges(*req); err != nil {
		return err
	}
	switch {
	case m.cfg.MaxExecOutput > 0 && req.MaxOutputBytes > m.cfg.MaxExecOutput:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "max_output_bytes %d exceeds the server maximum %d", req.MaxOutputBytes, m.cfg.MaxExecOutput)
	case req.MaxOutputBytes == 0 && m.cfg.ExecOutput > 0:
		req.MaxOutputBytes = m.cfg.ExecOutput
	}
	return nil
}

// execRanges checks req's numeric fields against their ranges.
func execRanges(req wire.ExecRequest) error {
	if err := RangeExecTimeout.Check(req.TimeoutMS); err != nil {
		return err
	}
	return RangeExecOutput.Check(req.MaxOutputBytes)
}

// execTarget is the sandbox an exec runs in: its entry, ID and runtime,
// and the client of its agent. early marks an exec sent while the sandbox
// was being created (Run), whose start latency includes the create's and
// is kept out of the exec start metric.
type execTarget struct {
	e       *entry
	id      string
	runtime string
	client  *agentclient.Client
	early   bool
}

// exec runs the checked request req in t; before is the sandbox's OOM-kill
// count when the request was made (oomErr when it could not be read). The
// caller checks whether an unavailable agent means a dead sandbox
// (checkAlive), which a sandbox still being created is not.
func (m *Manager) exec(ctx context.Context, t execTarget, req wire.ExecRequest, before int64, oomErr error, fn func(wire.ExecEvent) error) error {
	e, id, runtime, client := t.e, t.id, t.runtime, t.client
	defer m.busy(e)()
	drv := m.drivers[runtime]
	start, started := time.Now(), false
	return client.Exec(ctx, req, func(ev wire.ExecEvent) error {
		if !started && ev.Type == wire.EventStart {
			started = true
			if !t.early {
				m.met.ExecStartSeconds.Observe(time.Since(start).Seconds(), runtime)
			}
		}
		if ev.Type == wire.EventExit && ev.Signal == "SIGKILL" && oomErr == nil {
			if after, err := oomKills(ctx, drv, id); err == nil && after > before {
				ev.OOMKilled = true
				m.noteOOM(e, before, after)
			}
		}
		return fn(ev)
	})
}

// oomKills reads instance id's OOM-kill count, through
// driver.OOMCounter where drv has it (Stats of gVisor asks the agent too).
func oomKills(ctx context.Context, drv driver.Driver, id string) (int64, error) {
	if c, ok := drv.(driver.OOMCounter); ok {
		return c.OOMKills(ctx, id)
	}
	st, err := drv.Stats(ctx, id)
	return st.OOMKills, err
}

// StartProcess starts a process that outlives the request (see
// agentclient.Client.StartProcess) in a running sandbox. As with Exec, the
// sandbox's environment is the base of the process's.
func (m *Manager) StartProcess(ctx context.Context, id string, req wire.StartRequest) (wire.ProcessInfo, error) {
	if err := execRanges(req.ExecRequest); err != nil {
		return wire.ProcessInfo{}, err
	}
	if p := req.PTY; p != nil {
		if err := errors.Join(RangePTYCols.Check(int64(p.Cols)), RangePTYRows.Check(int64(p.Rows))); err != nil {
			return wire.ProcessInfo{}, err
		}
	}
	e, client, _, err := m.running(ctx, id, &req.ExecRequest)
	if err != nil {
		return wire.ProcessInfo{}, err
	}
	action := "process"
	if req.PTY != nil {
		action = "pty"
	}
	rec, err := m.auditStart(ctx, action, id, req.ExecRequest)
	if err != nil {
		return wire.ProcessInfo{}, err
	}
	start := time.Now()
	info, err := client.StartProcess(ctx, req)
	if err != nil {
		m.auditEnd(rec, start, nil, err)
	} else {
		go m.auditProcessExit(client, info.PID, rec, start)
	}
	if errors.Is(err, errdefs.ErrUnavailable) {
		m.checkAlive(context.WithoutCancel(ctx), e)
	}
	return info, err
}

// auditProcessExit waits for background process pid to end and records
// how it ended. A sandbox deleted under the process records the error; a
// manager that closes stops waiting, since the process may outlive it.
func (m *Manager) auditProcessExit(client *agentclient.Client, pid int, rec audit.Record, start time.Time) {
	if m.cfg.Audit == nil {
		return
	}
	ctx, cancel := m.untilClose()
	defer cancel()
	info, err := client.Wait(ctx, pid)
	if ctx.Err() != nil {
		return
	}
	m.auditEnd(rec, start, &wire.ExecEvent{ExitCode: info.ExitCode, Signal: info.Signal}, err)
}

// running returns a running sandbox's entry, agent and runtime, and fills
// in what req leaves to the sandbox and its template (withDefaults).
func (m *Manager) running(ctx context.Context, id string, req *wire.ExecRequest) (*entry, *agentclient.Client, string, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.sandboxes[id]
	if !ok || e.sb.Pool != "" || !tenancy.Sees(ctx, e.sb.Tenant) {
		return nil, nil, "", errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s not found", id)
	}
	if e.sb.State != StateRunning || e.agent == nil {
		return nil, nil, "", notRunning(id, e.sb.State)
	}
	e.act.touch(m.cfg.Now())
	m.execDefaults(e, req)
	return e, e.agent, e.sb.Runtime, nil
}

// execDefaults fills in what req leaves to the sandbox of e: its
// template's and its own defaults, then its network's proxy environment
// under them. The caller holds m.mu.
func (m *Manager) execDefaults(e *entry, req *wire.ExecRequest) {
	m.withDefaults(e.sb, req)
	withNetworkEnv(e, req)
}

// checkAlive marks a sandbox as errored when its instance is gone, so that
// a dead sandbox says so instead of timing out on every call.
func (m *Manager) checkAlive(ctx context.Context, e *entry) {
	m.mu.RLock()
	id, runtime, state := e.sb.ID, e.sb.Runtime, e.sb.State
	m.mu.RUnlock()
	if state != StateRunning {
		return
	}
	st, err := m.drivers[runtime].Status(ctx, id)
	if err != nil || st == driver.StatusRunning || st == driver.StatusPaused {
		return
	}
	_, unlock, err := m.lock(e, id)
	if err != nil { // deleted meanwhile
		return
	}
	defer unlock()
	cause := fmt.Errorf("sandbox %s stopped unexpectedly (instance is %s)", id, st)
	if n, err := oomKills(ctx, m.drivers[runtime], id); err == nil && m.noteOOM(e, -1, n) {
		cause = fmt.Errorf("sandbox %s stopped unexpectedly (instance is %s) after an OOM kill: it went past its memory limit", id, st)
	}
	m.setError(ctx, e, cause)
}

// noteOOM publishes events.OOMKilled when after, the OOM-kill count of
// e's instance, is past both the count reported before and before (the
// count when an exec began; -1 when not known), and reports whether it
// did: one event per kill, however many execs see it. With neither count
// known (an instance found at Start, seen only dead), it publishes
// nothing rather than report kills that may be old.
func (m *Manager) noteOOM(e *entry, before, after int64) bool {
	m.mu.Lock()
	base := max(e.oomKills, before)
	if base < 0 || after <= base {
		m.mu.Unlock()
		return false
	}
	e.oomKills = after
	sb := e.sb.clone()
	m.mu.Unlock()
	m.emit(events.OOMKilled, sb, nil)
	return true
}
