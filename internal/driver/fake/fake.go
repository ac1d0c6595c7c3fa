// Package fake is a driver.Driver for fast unit tests of the Manager and
// the API. Each sandbox is an in-process agent (agentserver.Server) whose file
// operations are rooted in the sandbox's RootFS and whose processes run on
// the host, served on a unix socket under Config.Root. It enforces no
// limits, isolates no processes and binds no host directories (Spec keeps
// the Mounts a sandbox was created with); tests inject failures through
// Config hooks and inspect the calls the driver received.
package fake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

var (
	_ driver.Driver  = (*Driver)(nil)
	_ driver.Pauser  = (*Driver)(nil)
	_ driver.Updater = (*Driver)(nil)
)

// Config configures a fake driver.
type Config struct {
	// Root is a directory for the agents' sockets (<Root>/<id>.sock); keep
	// it short, a unix socket path holds at most 107 bytes.
	Root string
	// FailCreate, when set, is called first by every Create; a non-nil
	// result fails the Create (wrapped) before anything is made.
	FailCreate func(id string) error
	// FailDelete, when set, is called first by every Delete; a non-nil
	// result fails the Delete (wrapped) and keeps the sandbox.
	FailDelete func(id string) error
	// FailUpdate, when set, is called first by every Update; a non-nil
	// result fails the Update (wrapped) and keeps the limits.
	FailUpdate func(id string) error
	// Logger is passed to the in-process agents; nil discards.
	Logger *slog.Logger
	// PrivateDisk is reported as the capability, for tests of how the
	// Manager treats runtimes whose writes storage never sees.
	PrivateDisk bool
}

// Call is one recorded driver call.
type Call struct {
	// Op is the method name ("Create", "Delete", "Pause", ...).
	Op string
	// ID is the sandbox ID the call was about.
	ID string
}

// Driver is the fake driver. It is safe for concurrent use.
type Driver struct {
	cfg Config

	mu    sync.Mutex
	boxes map[string]*box
	calls []Call
}

// box is one fake sandbox: an agent server and the goroutine serving it.
type box struct {
	spec      driver.Spec
	status    driver.Status
	resources driver.Resources
	stats     driver.Stats
	sock      string
	agent     *agentserver.Server
	server    *http.Server
	served    chan struct{} // closed when the serving goroutine returns
	stopOnce  sync.Once
}

// New returns a fake driver with its sockets under cfg.Root, which must
// exist.
func New(cfg Config) (*Driver, error) {
	if cfg.Root == "" {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "fake driver needs a root directory")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Driver{cfg: cfg, boxes: make(map[string]*box)}, nil
}

func (d *Driver) record(op, id string) {
	d.mu.Lock()
	d.calls = append(d.calls, Call{Op: op, ID: id})
	d.mu.Unlock()
}

// Calls returns a copy of the calls received so far, in order.
func (d *Driver) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// Name returns "fake".
func (d *Driver) Name() string { return "fake" }

// Capabilities reports pause (a status flip only), "none" isolation and
// Config.PrivateDisk.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Pause: true, Isolation: "none", PrivateDisk: d.cfg.PrivateDisk}
}

// Create starts an in-process agent for spec. RootFS must be an existing
// directory.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) error {
	d.record("Create", spec.ID)
	if d.cfg.FailCreate != nil {
		if err := d.cfg.FailCreate(spec.ID); err != nil {
			return fmt.Errorf("creating container %s: %w", spec.ID, err)
		}
	}
	// The real drivers' rule, so that tests above the driver see the
	// same refusals.
	if err := driver.CheckID(spec.ID); err != nil {
		return fmt.Errorf("creating container %s: %w", spec.ID, err)
	}
	if fi, err := os.Stat(spec.RootFS); err != nil || !fi.IsDir() {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "creating container %s: root file system %q is not a directory", spec.ID, spec.RootFS)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.boxes[spec.ID]; ok {
		return errdefs.Errorf(errdefs.ErrAlreadyExists, "creating container %s: already exists", spec.ID)
	}
	b := &box{
		spec:      spec,
		status:    driver.StatusRunning,
		resources: spec.Resources,
		sock:      filepath.Join(d.cfg.Root, spec.ID+".sock"),
	}
	if err := b.start(d.cfg.Logger); err != nil {
		return fmt.Errorf("creating container %s: %w", spec.ID, err)
	}
	d.boxes[spec.ID] = b
	if spec.Started != nil {
		spec.Started()
	}
	return nil
}

func (b *box) start(log *slog.Logger) error {
	_ = os.Remove(b.sock)
	l, err := net.Listen("unix", b.sock)
	if err != nil {
		return fmt.Errorf("listening for the agent: %w", err)
	}
	b.agent = agentserver.NewServer(agentserver.Options{Root: b.spec.RootFS, Version: "fake", Logger: log})
	b.server = &http.Server{Handler: b.agent.Handler()}
	b.served = make(chan struct{})
	go func() {
		defer close(b.served)
		_ = b.server.Serve(l)
	}()
	return nil
}

// stop closes the agent: the listener and every connection, and every
// process the agent started. Only the first call does anything.
func (b *box) stop() {
	b.stopOnce.Do(func() {
		_ = b.server.Close()
		<-b.served
		_ = b.agent.Close()
		_ = os.Remove(b.sock)
	})
}

// Delete stops the sandbox's agent and forgets it; unknown IDs are fine.
func (d *Driver) Delete(ctx context.Context, id string) error {
	d.record("Delete", id)
	if d.cfg.FailDelete != nil {
		if err := d.cfg.FailDelete(id); err != nil {
			return fmt.Errorf("deleting container %s: %w", id, err)
		}
	}
	d.mu.Lock()
	b, ok := d.boxes[id]
	delete(d.boxes, id)
	d.mu.Unlock()
	if ok {
		b.stop()
	}
	return nil
}

// Kill simulates the sandbox's init dying: the agent stops serving and
// the status becomes stopped, as after a crash inside a real sandbox.
func (d *Driver) Kill(id string) error {
	d.record("Kill", id)
	d.mu.Lock()
	b, ok := d.boxes[id]
	if ok {
		b.status = driver.StatusStopped
	}
	d.mu.Unlock()
	if !ok {
		return errdefs.Errorf(errdefs.ErrNotFound, "killing container %s: not found", id)
	}
	b.stop()
	return nil
}

// Status reports the recorded status, StatusUnknown for unknown IDs.
func (d *Driver) Status(ctx context.Context, id string) (driver.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if b, ok := d.boxes[id]; ok {
		return b.status, nil
	}
	return driver.StatusUnknown, nil
}

// List returns the IDs of all fake sandboxes, sorted.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.boxes))
	for id := range d.boxes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// DialAgent connects to the sandbox's in-process agent.
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	d.mu.Lock()
	b, ok := d.boxes[id]
	d.mu.Unlock()
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "dialing agent of %s: not found", id)
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", b.sock)
	if err != nil {
		return nil, fmt.Errorf("dialing agent of %s: %w", id, err)
	}
	return c, nil
}

// Stats returns the stats set with SetStats (zero by default).
func (d *Driver) Stats(ctx context.Context, id string) (driver.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return driver.Stats{}, errdefs.Errorf(errdefs.ErrNotFound, "reading stats of %s: not found", id)
	}
	return b.stats, nil
}

// SetStats sets what Stats reports for id.
func (d *Driver) SetStats(id string, s driver.Stats) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return errdefs.Errorf(errdefs.ErrNotFound, "setting stats of %s: not found", id)
	}
	b.stats = s
	return nil
}

// Resources returns the limits id was created or last updated with.
func (d *Driver) Resources(id string) (driver.Resources, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return driver.Resources{}, errdefs.Errorf(errdefs.ErrNotFound, "reading resources of %s: not found", id)
	}
	return b.resources, nil
}

// Spec returns the spec id was created with.
func (d *Driver) Spec(id string) (driver.Spec, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return driver.Spec{}, errdefs.Errorf(errdefs.ErrNotFound, "reading spec of %s: not found", id)
	}
	return b.spec, nil
}

// Pause marks a running sandbox paused. Its agent keeps serving: the fake
// freezes nothing.
func (d *Driver) Pause(ctx context.Context, id string) error {
	d.record("Pause", id)
	return d.transition(id, "pausing", driver.StatusRunning, driver.StatusPaused)
}

// Resume marks a paused sandbox running.
func (d *Driver) Resume(ctx context.Context, id string) error {
	d.record("Resume", id)
	return d.transition(id, "resuming", driver.StatusPaused, driver.StatusRunning)
}

func (d *Driver) transition(id, doing string, from, to driver.Status) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return errdefs.Errorf(errdefs.ErrNotFound, "%s container %s: not found", doing, id)
	}
	if b.status != from {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s container %s: container is %s", doing, id, b.status)
	}
	b.status = to
	return nil
}

// Update records new limits for a running sandbox.
func (d *Driver) Update(ctx context.Context, id string, r driver.Resources) error {
	d.record("Update", id)
	if d.cfg.FailUpdate != nil {
		if err := d.cfg.FailUpdate(id); err != nil {
			return fmt.Errorf("updating container %s: %w", id, err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.boxes[id]
	if !ok {
		return errdefs.Errorf(errdefs.ErrNotFound, "updating container %s: not found", id)
	}
	b.resources = r
	return nil
}

// Close stops every agent. Unlike a real driver's Close, the sandboxes do
// not outlive it: they live in this process.
func (d *Driver) Close() error {
	d.mu.Lock()
	boxes := d.boxes
	d.boxes = make(map[string]*box)
	d.mu.Unlock()
	for _, b := range boxes {
		b.stop()
	}
	return nil
}

// ErrInjected is a ready-made error for failure hooks.
var ErrInjected = errors.New("injected failure")
