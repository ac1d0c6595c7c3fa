package agentserver

import (
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

const (
	// drainTimeout bounds how long a process's output is awaited after it
	// exited: background grandchildren may keep the pipes open forever.
	drainTimeout = 50 * time.Millisecond
	// readBufSize is the largest output chunk one event carries.
	readBufSize = 32 << 10
	// maxKeptExited is how many exited background processes the table
	// keeps for their exit status and output; older ones are forgotten.
	maxKeptExited = 256
)

// procSpec is a validated exec or start request, ready to start.
type procSpec struct {
	path    string // executable, resolved through PATH
	argv    []string
	env     []string
	dir     string
	cred    *syscall.Credential // nil: run as the agent's own user
	stdin   []byte              // written first; nil and !openStdin: /dev/null
	timeout time.Duration       // 0: none

	// background makes the process belong to the table rather than to a
	// request: its output goes to a kept log, and it is kept after exit.
	background bool
	// openStdin keeps stdin open after stdin was written, for later writes.
	openStdin bool
	// term, when set, runs the process on a new terminal of this size.
	term *wire.PTYSize
	// user and tag are shown in ProcessInfo.
	user, tag string
}

// streamID names an output stream of a process.
type streamID uint8

const (
	streamStdout streamID = iota
	streamStderr
)

// chunk is one read from an output stream. data is shared by every
// subscriber and must not be modified.
type chunk struct {
	stream streamID
	data   []byte
}

// subscriber receives the output of a foreground process. The process
// closes ch after the last chunk, once the exit status is known (done is
// closed then); the subscriber calls stop when it stops reading so that
// output never blocks on it.
type subscriber struct {
	ch   chan chunk
	gone chan struct{}
	once sync.Once
}

func newSubscriber() *subscriber {
	return &subscriber{ch: make(chan chunk, 16), gone: make(chan struct{})}
}

func (s *subscriber) stop() { s.once.Do(func() { close(s.gone) }) }

// exitStatus is how a process ended.
type exitStatus struct {
	code     int
	signal   string // "SIGKILL" when a signal ended it
	timedOut bool
	lost     bool // the status could not be collected
}

// output is a read end of a process's output and the stream it carries.
type output struct {
	f  *os.File
	id streamID
}

// process is one process started by the agent, with its output and, once
// it exited, its kept exit status.
//
// A foreground process (POST /exec) sends its output to one subscriber
// and waits for it: output is backpressured to the process through the
// pipe, and the process ends with its request. A background process
// writes to an outputLog that never waits, so any number of followers
// come and go while it runs.
type process struct {
	pid        int
	argv       []string
	dir        string
	user, tag  string
	background bool
	startedAt  time.Time

	sub     *subscriber // foreground only
	out     *outputLog  // background only
	outputs []output    // read ends owned by the pumps and the monitor
	stdin   *stdinPipe  // nil when stdin is /dev/null
	term    *os.File    // the terminal's master, also in outputs and stdin; nil without PTY
	status  <-chan syscall.WaitStatus
	written atomic.Int64 // output bytes of a foreground process

	mu       sync.Mutex
	reaped   bool
	timedOut bool
	timer    *time.Timer

	done     chan struct{} // closed once exit is set and output has ended
	exit     exitStatus
	exitedAt time.Time
}

// signalGroup sends sig to the process group of p (the whole job the exec
// started) and to p itself, unless p was reaped: after that its pid may
// belong to someone else.
func (p *process) signalGroup(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.signalLocked(sig)
}

func (p *process) signalLocked(sig syscall.Signal) {
	if p.reaped {
		return
	}
	_ = syscall.Kill(-p.pid, sig)
	_ = syscall.Kill(p.pid, sig) // in case it left its group
}

func (p *process) kill() { p.signalGroup(syscall.SIGKILL) }

func (p *process) onTimeout() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return
	}
	p.timedOut = true
	p.signalLocked(syscall.SIGKILL)
}

// exited reports whether p has ended and its output is complete.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// info describes p. Exit fields are filled once p.done is closed.
func (p *process) info() wire.ProcessInfo {
	info := wire.ProcessInfo{
		PID:        p.pid,
		Cmd:        p.argv,
		Cwd:        p.dir,
		User:       p.user,
		Tag:        p.tag,
		PTY:        p.term != nil,
		Background: p.background,
		Running:    !p.exited(),
		StartedAt:  p.startedAt,
	}
	if p.out != nil {
		info.OutputBytes = p.out.total()
	} else {
		info.OutputBytes = p.written.Load()
	}
	if !info.Running {
		at := p.exitedAt
		info.ExitedAt = &at
		if !p.exit.lost {
			code := p.exit.code
			info.ExitCode = &code
		}
		info.Signal = p.exit.signal
		info.TimedOut = p.exit.timedOut
	}
	return info
}

// procTable holds the processes the agent started, by pid: running ones
// and the newest maxKeptExited exited background ones. It owns every
// goroutine that serves them and, under Init, the reaper.
type procTable struct {
	log      *slog.Logger
	reaper   *reaper // nil: wait for each pid directly
	forkExec ForkExecFunc
	bufs     sync.Pool

	mu     sync.Mutex
	closed bool
	procs  map[int]*process
	kept   []*process     // exited background processes in procs, oldest first
	wg     sync.WaitGroup // one count per started process, until done
}

func newProcTable(log *slog.Logger, r *reaper, forkExec ForkExecFunc) *procTable {
	if forkExec == nil {
		forkExec = syscall.ForkExec
	}
	t := &procTable{log: log, reaper: r, forkExec: forkExec, procs: make(map[int]*process)}
	t.bufs.New = func() any { b := make([]byte, readBufSize); return &b }
	return t
}

// start starts spec in a new process group (a new session with a PTY).
// A foreground process sends its output to sub; a background one (sub
// nil) to a new outputLog. A process that cannot start returns an errdefs
// error and leaves nothing behind. Cost: one fork/exec, up to three pipes'
// worth of fds and up to three goroutines (monitor and one output pump per
// stream) per running process, plus a feeder while initial stdin is
// written.
func (t *procTable) start(spec procSpec, sub *subscriber) (*process, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errShuttingDown
	}
	t.wg.Add(1)
	t.mu.Unlock()

	p, err := t.spawn(spec)
	if err != nil {
		t.wg.Done()
		return nil, err
	}
	p.sub = sub
	if spec.background {
		p.out = newOutputLog()
	}

	t.mu.Lock()
	if old := t.procs[p.pid]; old != nil {
		// A kept exited process whose pid the kernel handed out again.
		t.kept = slices.DeleteFunc(t.kept, func(q *process) bool { return q == old })
	}
	t.procs[p.pid] = p
	closed := t.closed
	t.mu.Unlock()
	if spec.timeout > 0 {
		p.mu.Lock()
		p.timer = time.AfterFunc(spec.timeout, p.onTimeout)
		p.mu.Unlock()
	}
	var fed chan struct{}
	if spec.stdin != nil {
		// The feeder owns stdin from now on, so that writes that arrive
		// after start returns come after the initial bytes.
		fed = make(chan struct{})
		p.stdin.owner <- struct{}{}
		go p.stdin.feed(spec.stdin, !spec.openStdin && spec.term == nil, fed)
	}
	go t.monitor(p, fed)
	if closed {
		p.kill() // close ran while we were forking and could not see p
	}
	return p, nil
}

// file updates the table once p has ended: a foreground process leaves it,
// a background one joins the kept exited ones, pushing out the oldest.
// Nothing happens when p was removed (or its pid reused) meanwhile.
func (t *procTable) file(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[p.pid] != p {
		return
	}
	if !p.background {
		delete(t.procs, p.pid)
		return
	}
	t.kept = append(t.kept, p)
	if len(t.kept) > maxKeptExited {
		old := t.kept[0]
		t.kept[0] = nil
		t.kept = t.kept[1:]
		if t.procs[old.pid] == old {
			delete(t.procs, old.pid)
		}
	}
}

// get returns the process with pid, running or kept.
func (t *procTable) get(pid int) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.procs[pid]
	if p == nil {
		return nil, errorf(errdefs.ErrNotFound, "process %d not found", pid)
	}
	return p, nil
}

// list describes every process in the table, oldest first.
func (t *procTable) list() []wire.ProcessInfo {
	t.mu.Lock()
	procs := make([]*process, 0, len(t.procs))
	for _, p := range t.procs {
		procs = append(procs, p)
	}
	t.mu.Unlock()
	slices.SortFunc(procs, func(a, b *process) int {
		if c := a.startedAt.Compare(b.startedAt); c != 0 {
			return c
		}
		return a.pid - b.pid
	})
	infos := make([]wire.ProcessInfo, len(procs))
	for i, p := range procs {
		infos[i] = p.info()
	}
	return infos
}

// remove forgets the process with pid and kills its group if it still
// runs. It does not wait for the process to die; the table's goroutines
// for it end as usual and Close still waits for them.
func (t *procTable) remove(pid int) error {
	t.mu.Lock()
	p := t.procs[pid]
	if p == nil {
		t.mu.Unlock()
		return errorf(errdefs.ErrNotFound, "process %d not found", pid)
	}
	delete(t.procs, pid)
	t.kept = slices.DeleteFunc(t.kept, func(q *process) bool { return q == p })
	t.mu.Unlock()
	p.kill()
	return nil
}

// close kills every process, waits until all are reaped and their
// goroutines ended, and stops the reaper. Idempotent.
func (t *procTable) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	procs := make([]*process, 0, len(t.procs))
	for _, p := range t.procs {
		procs = append(procs, p)
	}
	t.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
	t.wg.Wait()
	if t.reaper != nil {
		t.reaper.stopReaper()
	}
}
