package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// A ready snapshot is a memory snapshot of a new sandbox of a template,
// taken once the sandbox was running (and so its template's service
// ready), which later sandboxes of the template on the same runtime start
// from instead of booting: their processes, the service's among them,
// continue from the moment of the capture. It belongs to its template,
// which names it in Template.ReadySnapshots: it is not listed with the
// users' snapshots, cannot be deleted or restored by name, and goes with
// its template.
//
// A create uses it only when what a restore cannot change matches: the
// sandbox's CPU, memory and pids limits must be those of the capture
// (the Manager's defaults), under which the restored processes started
// and sized themselves, and it must have no mounts, which processes
// restored from a capture without them would not see as a fresh start
// does. Anything else creates
// cold. The sandbox's environment, metadata, network policy, disk quota
// and timers are its own, but processes restored from the capture keep
// the environment they started with: so for a template with a service,
// which a cold create starts with the sandbox's environment and its
// network's proxy settings, a sandbox with an environment of its own or
// a network other than the default one creates cold too.
// A restored sandbox keeps the hostname of the capture sandbox, as a fork
// copy keeps its source's.

// readyPrefix starts the name of every ready snapshot. Users' snapshot
// names start with a letter or a digit (ValidateTemplateName), so the two
// never collide.
const readyPrefix = "_ready-"

// isReadySnapshot reports whether name is a ready snapshot's.
func isReadySnapshot(name string) bool { return strings.HasPrefix(name, readyPrefix) }

// readyWait bounds how long dropping a ready snapshot waits for the
// restores that still read it.
const readyWait = time.Minute

// CaptureReady makes the ready snapshot of template on runtime (the
// default runtime when empty) and records it on the template, replacing
// the one it had there: it creates a sandbox of the template with the
// default limits (which returns once the template's service is ready),
// saves it with its memory, and deletes it. On failure nothing is left:
// neither the sandbox nor a snapshot, and the template keeps its former
// ready snapshot. A runtime that cannot save memory is refused with
// ErrFailedPrecondition. The cost is a cold create plus a memory
// snapshot; sandboxes of the template made meanwhile are not affected.
func (m *Manager) CaptureReady(ctx context.Context, template, runtime string) (_ Template, err error) {
	if runtime == "" {
		runtime = m.cfg.DefaultRuntime
	}
	if _, ok := m.drivers[runtime]; !ok {
		return Template{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown runtime %q (available: %s)", runtime, strings.Join(m.runtimeNames(), ", "))
	}
	m.mu.RLock()
	_, err = m.templateToChange(ctx, template)
	m.mu.RUnlock()
	if err != nil {
		return Template{}, err
	}
	if m.SnapshotKind(runtime) != SnapshotMemory {
		return Template{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "runtime %s cannot save a sandbox's memory, which a ready snapshot holds", runtime)
	}
	sb, drv, err := m.admit(ctx, Spec{Template: template, Runtime: runtime})
	if err != nil {
		return Template{}, err
	}
	sb.createdBy(ctx)
	// Cold on purpose: a capture from the former ready snapshot would
	// keep what that one holds.
	if sb, err = m.create(ctx, sb, drv, nil, nil); err != nil {
		return Template{}, fmt.Errorf("capturing template %s ready on %s: %w", template, runtime, err)
	}
	defer func() {
		if derr := m.Delete(context.WithoutCancel(ctx), sb.ID); derr != nil {
			derr = fmt.Errorf("deleting the capture sandbox %s of template %s: %w", sb.ID, template, derr)
			if err != nil {
				err = errors.Join(err, derr)
				return
			}
			m.log.Error("capturing a ready snapshot", "template", template, "err", derr)
		}
	}()
	name := readyPrefix + template + "-" + runtime + "-" + newID()[:8]
	if _, err := m.snapshot(ctx, sb.ID, SnapshotSpec{Name: name}); err != nil {
		return Template{}, fmt.Errorf("capturing template %s ready on %s: %w", template, runtime, err)
	}
	// Recorded while the capture sandbox still exists, so that the
	// template cannot be deleted in between.
	t, old, err := m.setReady(ctx, template, runtime, name)
	if err != nil {
		if derr := m.dropSnapshot(context.WithoutCancel(ctx), name); derr != nil {
			err = errors.Join(err, derr)
		}
		return Template{}, err
	}
	if old != "" {
		if err := m.dropSnapshot(ctx, old); err != nil {
			m.log.Error("removing a replaced ready snapshot", "template", template, "snapshot", old, "err", err)
		}
	}
	m.log.Info("ready snapshot captured", "template", template, "runtime", runtime, "snapshot", name)
	return t, nil
}

// setReady records name (nothing when empty) as the ready snapshot of
// template on runtime and returns the template and the name it replaced.
func (m *Manager) setReady(ctx context.Context, template, runtime, name string) (Template, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.templates[template]
	if !ok {
		return Template{}, "", errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", template)
	}
	t = t.clone()
	old := t.ReadySnapshots[runtime]
	if name == "" {
		delete(t.ReadySnapshots, runtime)
	} else {
		if t.ReadySnapshots == nil {
			t.ReadySnapshots = map[string]string{}
		}
		t.ReadySnapshots[runtime] = name
	}
	if len(t.ReadySnapshots) == 0 {
		t.ReadySnapshots = nil
	}
	if err := m.cfg.Store.PutTemplate(ctx, t); err != nil {
		return Template{}, "", fmt.Errorf("recording template %q: %w", template, err)
	}
	m.templates[template] = t
	return t.clone(), old, nil
}

// DropReady removes the ready snapshot of template on runtime (the
// default runtime when empty); sandboxes of the template then start cold
// there. It waits for restores still reading the snapshot.
func (m *Manager) DropReady(ctx context.Context, template, runtime string) (Template, error) {
	if runtime == "" {
		runtime = m.cfg.DefaultRuntime
	}
	m.mu.RLock()
	t, err := m.templateToChange(ctx, template)
	m.mu.RUnlock()
	if err != nil {
		return Template{}, err
	}
	if t.ReadySnapshots[runtime] == "" {
		return Template{}, errdefs.Errorf(errdefs.ErrNotFound, "template %q has no ready snapshot on %s", template, runtime)
	}
	t, old, err := m.setReady(ctx, template, runtime, "")
	if err != nil {
		return Template{}, err
	}
	if old != "" {
		if err := m.dropSnapshot(ctx, old); err != nil {
			return Template{}, err
		}
	}
	return t, nil
}

// dropReadyOf removes the ready snapshots t names; DeleteTemplate calls it
// once t is no longer listed.
func (m *Manager) dropReadyOf(ctx context.Context, t Template) error {
	var errs []error
	for _, name := range t.ReadySnapshots {
		errs = append(errs, m.dropSnapshot(ctx, name))
	}
	return errors.Join(errs...)
}

// dropSnapshot deletes ready snapshot name, waiting up to readyWait for
// the restores that read it: no template names it any more, so no new
// one starts. A snapshot already gone is not an error.
func (m *Manager) dropSnapshot(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	for {
		err := m.deleteSnapshot(ctx, name)
		if err == nil || errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("removing ready snapshot %s: %w", name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// createFresh creates the admitted sandbox sb, which has no source of its
// own: from its template's ready snapshot on its runtime when one fits
// (see the top of this file), cold otherwise.
func (m *Manager) createFresh(ctx context.Context, sb Sandbox, drv driver.Driver, started startedFunc) (Sandbox, error) {
	src, release := m.readySource(sb)
	if release != nil {
		defer release()
	}
	return m.create(ctx, sb, drv, src, started)
}

// readySource returns the ready snapshot that sb may start from and its
// release, or nil and nil. A snapshot that fails its checksums is logged
// and passed over: the create goes on cold.
func (m *Manager) readySource(sb Sandbox) (*restoreSource, func()) {
	if len(sb.Mounts) > 0 {
		return nil, nil
	}
	m.mu.RLock()
	t := m.templates[sb.Template]
	m.mu.RUnlock()
	name := t.ReadySnapshots[sb.Runtime]
	if name == "" || (t.Service != nil && !m.serviceAsCaptured(sb)) {
		return nil, nil
	}
	s, dir, release, err := m.useSnapshot(context.Background(), name)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) { // not found: dropped meanwhile
			m.log.Warn("ready snapshot unusable; creating cold", "template", sb.Template, "snapshot", name, "err", err)
		}
		return nil, nil
	}
	if s.MilliCPUs != sb.MilliCPUs || s.MemoryBytes != sb.MemoryBytes || s.Pids != sb.Pids || s.Kind != SnapshotMemory {
		release()
		return nil, nil
	}
	return &restoreSource{dir: dir, memory: true}, release
}

// serviceAsCaptured reports whether a cold create of sb would start its
// template's service as the capture did: with the template's environment
// alone (the sandbox adds none) and the default network's.
func (m *Manager) serviceAsCaptured(sb Sandbox) bool {
	return len(sb.Env) == 0 && !hasRules(sb.Network) && sb.Network.Mode == m.cfg.DefaultNetwork
}

// reconcileReady forgets the ready snapshots that templates name but the
// snapshot directory lost, and removes the ready snapshots no template
// names (a crash between their capture and their record). It runs after
// reconcileSnapshots.
func (m *Manager) reconcileReady(ctx context.Context) error {
	named := map[string]bool{}
	for _, t := range m.Templates(ctx) {
		for rt, name := range t.ReadySnapshots {
			m.snaps.mu.Lock()
			_, ok := m.snaps.byName[name]
			m.snaps.mu.Unlock()
			if ok {
				named[name] = true
				continue
			}
			m.log.Warn("ready snapshot lost; sandboxes of the template start cold", "template", t.Name, "runtime", rt, "snapshot", name)
			if _, _, err := m.setReady(ctx, t.Name, rt, ""); err != nil {
				return err
			}
		}
	}
	m.snaps.mu.Lock()
	var orphans []string
	for name := range m.snaps.byName {
		if isReadySnapshot(name) && !named[name] {
			orphans = append(orphans, name)
		}
	}
	m.snaps.mu.Unlock()
	for _, name := range orphans {
		m.log.Info("removing a ready snapshot no template names", "snapshot", name)
		if err := m.deleteSnapshot(ctx, name); err != nil {
			return err
		}
	}
	return nil
}
