package agentserver

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// unclaimedTTL bounds how long the reaper keeps the status of a pid that no
// one has registered. A child can exit (and be reaped) between fork and
// registration; its starter registers within microseconds, so anything
// older is an orphan that nobody will ask about. Pids are allocated
// cyclically, so a pid is not reused within this window.
const unclaimedTTL = 5 * time.Second

// reaper is the only waiter for children when the agent is PID 1: orphans
// of the whole sandbox are re-parented to it, and waiting for specific
// pids would leave them as zombies. It waits for any child on SIGCHLD and
// hands each status to the process registered for its pid.
type reaper struct {
	sigc chan os.Signal
	stop chan struct{}
	done chan struct{}

	mu        sync.Mutex
	waiters   map[int]chan syscall.WaitStatus
	unclaimed map[int]unclaimedStatus
}

type unclaimedStatus struct {
	status syscall.WaitStatus
	at     time.Time
}

// startReaper starts the reaper goroutine; stopReaper stops and waits for it.
func startReaper() *reaper {
	r := &reaper{
		// One buffered slot is enough: SIGCHLDs coalesce, and every wakeup
		// reaps until no exited child is left.
		sigc:      make(chan os.Signal, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		waiters:   make(map[int]chan syscall.WaitStatus),
		unclaimed: make(map[int]unclaimedStatus),
	}
	signal.Notify(r.sigc, syscall.SIGCHLD)
	go r.run()
	return r
}

func (r *reaper) run() {
	defer close(r.done)
	for {
		// Reap before the first wait too: children may have exited before
		// the signal handler was installed.
		r.reapAll()
		select {
		case <-r.sigc:
		case <-r.stop:
			return
		}
	}
}

func (r *reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD (no children) or none exited yet
		}
		if ws.Stopped() || ws.Continued() {
			continue // not an exit; wait4 without WUNTRACED does not report these anyway
		}
		r.dispatch(pid, ws)
	}
}

func (r *reaper) dispatch(pid int, ws syscall.WaitStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- ws // buffered; never blocks
		return
	}
	now := time.Now()
	for p, u := range r.unclaimed {
		if now.Sub(u.at) > unclaimedTTL {
			delete(r.unclaimed, p)
		}
	}
	r.unclaimed[pid] = unclaimedStatus{status: ws, at: now}
}

// register returns a channel that receives the exit status of pid exactly
// once. Call it right after starting pid; a status that arrived first is
// delivered at once.
func (r *reaper) register(pid int) <-chan syscall.WaitStatus {
	ch := make(chan syscall.WaitStatus, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if u, ok := r.unclaimed[pid]; ok {
		delete(r.unclaimed, pid)
		ch <- u.status
		return ch
	}
	r.waiters[pid] = ch
	return ch
}

// stopReaper stops the reaper goroutine and waits for it. Processes still
// registered never receive a status, so call it after they have exited.
func (r *reaper) stopReaper() {
	signal.Stop(r.sigc)
	close(r.stop)
	<-r.done
}
