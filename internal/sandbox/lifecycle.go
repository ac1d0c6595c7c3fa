package sandbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
)

// Action is what a lifecycle timer does to a sandbox when it fires.
type Action string

// The lifecycle actions. An empty Action in a Spec or a Lifecycle means
// ActionDestroy at create and "keep the current one" in SetLifecycle.
const (
	// ActionDestroy deletes the sandbox and everything it holds.
	ActionDestroy Action = "destroy"
	// ActionPause freezes the sandbox (runtimes with driver.Pauser only).
	// A sandbox paused by its deadline has the deadline cleared: it stays
	// paused until someone resumes it and sets a new timeout.
	ActionPause Action = "pause"
	// ActionStop stops the sandbox (Manager.Stop): its processes end and
	// its memory and CPU are free, its files stay until a start. A
	// stopped sandbox has no deadline and no idle timer.
	ActionStop Action = "stop"
)

// Lifecycle is a change of a sandbox's lifecycle timers (SetLifecycle): a
// nil IdleTimeout and empty actions keep the current values; a pointer to 0
// turns the idle timeout off.
type Lifecycle struct {
	IdleTimeout *time.Duration
	OnDeadline  Action
	OnIdle      Action
}

// lifecycle is the Manager's part of the lifecycle timers.
type lifecycle struct {
	// pause pauses a running sandbox. Nil means the Manager's own Pause
	// method, when it has one; tests set it.
	pause func(ctx context.Context, id string) (Sandbox, error)
}

// activity is when a sandbox was last used. It is read and written without
// Manager.mu, so exec stays off the Manager's write lock.
type activity struct {
	last atomic.Int64 // unix nanoseconds of the last use; 0: not seen yet
	busy atomic.Int32 // execs and attach sessions in flight
}

func (a *activity) touch(now time.Time) { a.last.Store(now.UnixNano()) }

// idle reports whether nothing used the sandbox for longer than d. The
// first call after a create, a restart or a pause starts the clock.
func (a *activity) idle(now time.Time, d time.Duration) bool {
	if a.busy.Load() > 0 {
		return false
	}
	last := a.last.Load()
	if last == 0 {
		a.touch(now)
		return false
	}
	return now.Sub(time.Unix(0, last)) > d
}

// busy marks e in use until the returned function is called, which counts
// as its last activity.
func (m *Manager) busy(e *entry) func() {
	e.act.busy.Add(1)
	return func() {
		e.act.touch(m.cfg.Now())
		e.act.busy.Add(-1)
	}
}

// Active marks sandbox id as in use until the returned function is called,
// for sessions such as a PTY attach whose traffic does not pass through the
// Manager. An unknown id gets a function that does nothing. Being active
// holds off the idle timeout only, never the deadline.
func (m *Manager) Active(id string) (release func()) {
	m.mu.RLock()
	e, ok := m.sandboxes[id]
	m.mu.RUnlock()
	if !ok {
		return func() {}
	}
	return m.busy(e)
}

// pauser returns the function that carries out ActionPause: Pause, or the
// replacement a test set.
func (m *Manager) pauser() func(ctx context.Context, id string) (Sandbox, error) {
	if m.life.pause != nil {
		return m.life.pause
	}
	return m.Pause
}

// admitLifecycle checks l for a sandbox on drv and fills its defaults: no
// idle timeout, ActionDestroy. The pause action needs a runtime that
// implements driver.Pauser and a Manager that can pause; otherwise the
// error wraps errdefs.ErrNotImplemented.
func (m *Manager) admitLifecycle(drv driver.Driver, l Lifecycle) (Lifecycle, error) {
	out := Lifecycle{IdleTimeout: new(time.Duration), OnDeadline: ActionDestroy, OnIdle: ActionDestroy}
	if l.IdleTimeout != nil {
		if err := RangeIdleTimeout.CheckDuration(*l.IdleTimeout); err != nil {
			return out, err
		}
		*out.IdleTimeout = *l.IdleTimeout
	}
	for _, a := range []struct {
		name string
		v    Action
		dst  *Action
	}{{"on_deadline", l.OnDeadline, &out.OnDeadline}, {"on_idle", l.OnIdle, &out.OnIdle}} {
		switch a.v {
		case "":
		case ActionDestroy:
			*a.dst = a.v
		case ActionPause:
			if _, ok := drv.(driver.Pauser); !ok {
				return out, errdefs.Errorf(errdefs.ErrNotImplemented, "%s action pause: runtime %s cannot pause sandboxes on this daemon", a.name, drv.Name())
			}
			*a.dst = a.v
		case ActionStop:
			if drv.Capabilities().PrivateDisk {
				return out, errdefs.Errorf(errdefs.ErrNotImplemented, "%s action stop: runtime %s keeps a sandbox's writes on a disk of its own, which a stop would lose (use pause or destroy)", a.name, drv.Name())
			}
			*a.dst = a.v
		default:
			return out, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown %s action %q (use destroy, pause or stop)", a.name, a.v)
		}
	}
	return out, nil
}

// timer is a lifecycle timer that fired for one sandbox.
type timer struct {
	id     string
	reason string // "deadline" or "idle"
	action Action
	state  State
}

// reapExpired fires the timers that are due: the deadline of every sandbox
// past it (except those being created), and the idle timeout of running
// sandboxes that nobody used for that long. It handles a few at a time and
// returns when all are done.
func (m *Manager) reapExpired() {
	now := m.cfg.Now()
	var due []timer
	m.mu.RLock()
	for id, e := range m.sandboxes {
		sb := &e.sb
		switch {
		case sb.State == StateCreating || sb.Pool != "" || resting(sb.State):
		case !sb.Deadline.IsZero() && now.After(sb.Deadline):
			due = append(due, timer{id, "deadline", sb.OnDeadline, sb.State})
		case sb.State != StateRunning:
			e.act.last.Store(0) // the idle clock starts again on resume
		case sb.IdleTimeout > 0 && e.act.idle(now, sb.IdleTimeout):
			due = append(due, timer{id, "idle", sb.OnIdle, sb.State})
		}
	}
	m.mu.RUnlock()
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, t := range due {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			m.fire(context.Background(), t)
		}()
	}
	wg.Wait()
}

// fire carries out one timer's action. A deadline always ends in the
// sandbox being paused or gone: when pausing is impossible or fails, the
// sandbox is destroyed. An idle pause that fails is logged and tried again
// after another idle period.
func (m *Manager) fire(ctx context.Context, t timer) {
	log := m.log.With("sandbox_id", t.id, "timer", t.reason, "action", string(t.action))
	if t.action == ActionStop && m.stopFor(ctx, t, log) {
		return
	}
	if t.action == ActionPause && (t.state == StateRunning || t.state == StatePaused) {
		err := m.pauseFor(ctx, t)
		if err == nil {
			log.Info("sandbox timer fired")
			return
		}
		if t.reason == "idle" {
			log.Error("pausing idle sandbox", "err", err)
			if e, eerr := m.entry(ctx, t.id); eerr == nil {
				e.act.touch(m.cfg.Now())
			}
			return
		}
		log.Error("pausing sandbox at its deadline; destroying it instead", "err", err)
	}
	log.Info("sandbox timer fired")
	if t.reason == "deadline" {
		if sb, err := m.Get(ctx, t.id); err == nil {
			m.emit(events.Timeout, sb, nil)
		}
	}
	if err := m.Delete(ctx, t.id); err != nil {
		log.Error("deleting sandbox", "err", err)
	}
}

// pauseFor pauses a sandbox for timer t; for a deadline it then clears the
// deadline, so that the paused sandbox is not reaped.
func (m *Manager) pauseFor(ctx context.Context, t timer) error {
	pause := m.pauser()
	if pause == nil {
		return errdefs.Errorf(errdefs.ErrNotImplemented, "this daemon cannot pause sandboxes")
	}
	if t.state == StateRunning {
		if _, err := pause(ctx, t.id); err != nil {
			return err
		}
	}
	if t.reason != "deadline" {
		return nil
	}
	e, _, unlock, err := m.lockEntry(ctx, t.id)
	if err != nil {
		return err
	}
	defer unlock()
	m.mu.Lock()
	e.sb.Deadline = time.Time{}
	sb := e.sb.clone()
	m.mu.Unlock()
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		return fmt.Errorf("recording deadline of paused sandbox %s: %w", t.id, err)
	}
	return nil
}

// SetTimeout sets a sandbox's deadline to now+timeout (0: no deadline, when
// the server allows it). This is the only way a deadline changes.
func (m *Manager) SetTimeout(ctx context.Context, id string, timeout time.Duration) (Sandbox, error) {
	e, _, unlock, err := m.lockEntry(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer unlock()
	deadline, err := m.deadline(m.cfg.Now(), timeout)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	if e.sb.State == StateStopped {
		m.mu.Unlock()
		return Sandbox{}, notRunning(id, StateStopped)
	}
	if e.sb.State == StateDeleting || e.sb.State == StateCreating {
		st := e.sb.State
		m.mu.Unlock()
		return Sandbox{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s is %s", id, st)
	}
	e.sb.Deadline = deadline
	sb := e.sb.clone()
	m.mu.Unlock()
	if err := m.cfg.Store.PutSandbox(ctx, sb); err != nil {
		return Sandbox{}, fmt.Errorf("recording timeout of sandbox %s: %w", id, err)
	}
	return sb, nil
}

// reapLoop fires the lifecycle timers that are due (reapExpired), until
// Close.
func (m *Manager) reapLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.reapExpired()
		}
	}
}
