// Package subreaper collects the exit statuses of processes that the daemon
// inherits as a child subreaper: the init processes of runc containers,
// which reparent to the daemon once `runc run --detach` exits.
//
// The reaper waits only for the PIDs it was told to watch, so it never
// steals the exit status of a process that os/exec (or anyone else in the
// daemon) waits for. It must not be used to wait for processes started with
// os/exec.
package subreaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// SetSubreaper marks the calling process as a child subreaper
// (PR_SET_CHILD_SUBREAPER): orphaned descendants reparent to it instead of
// to the machine's PID 1. The daemon calls it once at start, before it
// starts any container. It affects the whole process.
func SetSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting child subreaper: %w", err)
	}
	return nil
}

// Exit is the end of a watched process.
type Exit struct {
	// PID is the watched process ID.
	PID int
	// Status is the wait status; meaningful only when Err is nil.
	Status unix.WaitStatus
	// Err is set when the process could not be waited for, typically
	// ECHILD because it is not a child of this process (for example a
	// container started by an earlier daemon). The process may still run.
	Err error
}

// DefaultInterval is how often the reaper polls watched processes when
// no SIGCHLD arrives; signals can coalesce, so the poll is a fallback.
const DefaultInterval = 5 * time.Second

// Options configure a Reaper.
type Options struct {
	// Interval between fallback polls; DefaultInterval when zero.
	Interval time.Duration
	// Logger receives reap logs; nil discards them.
	Logger *slog.Logger
}

// Reaper waits for watched child processes. Create it with New and run it
// with Start; Close stops it. All methods are safe for concurrent use.
//
// Each SIGCHLD costs one wait4(WNOHANG) system call per watched process, a
// few microseconds each, so thousands of watched processes are fine.
type Reaper struct {
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	watched map[int]chan Exit

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a stopped reaper.
func New(opts Options) *Reaper {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Reaper{
		interval: opts.Interval,
		log:      opts.Logger,
		watched:  make(map[int]chan Exit),
		kick:     make(chan struct{}, 1),
	}
}

// Start starts the reaper's goroutine, which runs until ctx is done or
// Close is called. Start must be called at most once.
func (r *Reaper) Start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	r.mu.Lock()
	r.cancel = cancel
	r.done = make(chan struct{})
	r.mu.Unlock()
	go func() {
		defer close(r.done)
		defer signal.Stop(sigs)
		t := time.NewTicker(r.interval)
		defer t.Stop()
		for {
			r.reap()
			select {
			case <-ctx.Done():
				return
			case <-sigs:
			case <-r.kick:
			case <-t.C:
			}
		}
	}()
}

// Close stops the reaper's goroutine and waits for it. Watched processes
// stay watched but are no longer reaped; their channels are not closed.
func (r *Reaper) Close() error {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	return nil
}

// Watch registers pid and returns a channel that receives its Exit once
// and is then closed. The process must be a child of this process that no
// one else waits for; a process that has already exited (a zombie) is
// reaped on the next pass, which Watch triggers at once. Watching a pid
// twice returns the channel of the first call.
func (r *Reaper) Watch(pid int) <-chan Exit {
	r.mu.Lock()
	ch, ok := r.watched[pid]
	if !ok {
		ch = make(chan Exit, 1)
		r.watched[pid] = ch
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return ch
}

// Unwatch forgets pid without waiting for it. Its channel is closed
// without a value.
func (r *Reaper) Unwatch(pid int) {
	r.mu.Lock()
	ch, ok := r.watched[pid]
	delete(r.watched, pid)
	r.mu.Unlock()
	if ok {
		close(ch)
	}
}

// Watching reports how many processes are watched.
func (r *Reaper) Watching() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.watched)
}

// reap waits without blocking for every watched pid and reports the ones
// that ended. wait4 runs outside the lock; a concurrent Unwatch of the same
// pid is resolved by whoever removes it from the map first.
func (r *Reaper) reap() {
	r.mu.Lock()
	pids := make([]int, 0, len(r.watched))
	for pid := range r.watched {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue // retried on the next pass
		}
		if err == nil && got == 0 {
			continue // still running
		}
		exit := Exit{PID: pid, Status: ws}
		if err != nil {
			exit.Err = fmt.Errorf("waiting for pid %d: %w", pid, err)
		}
		r.mu.Lock()
		ch, ok := r.watched[pid]
		delete(r.watched, pid)
		r.mu.Unlock()
		if !ok {
			continue
		}
		r.log.Debug("reaped process", "pid", pid, "status", int(ws), "error", exit.Err)
		ch <- exit
		close(ch)
	}
}
