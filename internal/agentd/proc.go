package agentd

import (
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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

// spawn forks and execs spec with fresh pipes or a fresh terminal.
func (t *procTable) spawn(spec procSpec) (_ *process, err error) {
	var parentEnds, childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
		if err != nil {
			for _, f := range parentEnds {
				f.Close()
			}
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err != nil {
			return nil, nil, errorf(errdefs.ErrResourceExhausted, "creating pipe: %v", err)
		}
		return r, w, nil
	}

	p := &process{
		argv:       spec.argv,
		dir:        spec.dir,
		user:       spec.user,
		tag:        spec.tag,
		background: spec.background,
		done:       make(chan struct{}),
	}
	var files []uintptr
	sys := &syscall.SysProcAttr{Setpgid: true, Credential: spec.cred}
	if spec.term != nil {
		master, tty, err := openPTY(*spec.term, spec.cred)
		if err != nil {
			return nil, err
		}
		parentEnds, childEnds = append(parentEnds, master), append(childEnds, tty)
		p.term = master
		p.outputs = []output{{f: master, id: streamStdout}}
		p.stdin = newStdinPipe(master, true)
		files = []uintptr{tty.Fd(), tty.Fd(), tty.Fd()}
		// A new session with the terminal as its controlling tty: job
		// control and ^C work as in a login. The session leader also
		// leads its process group, so signals to -pid still reach it all.
		sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: spec.cred}
	} else {
		var stdinChild *os.File
		if spec.stdin != nil || spec.openStdin {
			r, w, err := pipe()
			if err != nil {
				return nil, err
			}
			stdinChild = r
			childEnds, parentEnds = append(childEnds, r), append(parentEnds, w)
			p.stdin = newStdinPipe(w, false)
		} else {
			f, err := os.Open(os.DevNull)
			if err != nil {
				return nil, errorf(errdefs.ErrInternal, "opening %s: %v", os.DevNull, err)
			}
			stdinChild = f
			childEnds = append(childEnds, f)
		}
		outR, outW, err := pipe()
		if err != nil {
			return nil, err
		}
		childEnds, parentEnds = append(childEnds, outW), append(parentEnds, outR)
		errR, errW, err := pipe()
		if err != nil {
			return nil, err
		}
		childEnds, parentEnds = append(childEnds, errW), append(parentEnds, errR)
		p.outputs = []output{{f: outR, id: streamStdout}, {f: errR, id: streamStderr}}
		// Fd puts the child ends in blocking mode, as a child expects; the
		// parent ends stay non-blocking so that Close interrupts a pending
		// Read.
		files = []uintptr{stdinChild.Fd(), outW.Fd(), errW.Fd()}
	}

	attr := &syscall.ProcAttr{Dir: spec.dir, Env: spec.env, Files: files, Sys: sys}
	p.startedAt = time.Now()
	pid, err := t.forkExec(spec.path, spec.argv, attr)
	if err != nil {
		return nil, startError(spec.argv[0], err)
	}
	p.pid = pid
	if t.reaper != nil {
		p.status = t.reaper.register(pid)
	}
	return p, nil
}

// startError classifies a failed fork/exec. The errno comes from the child
// between fork and exec: chdir, setgroups/setuid, or execve.
func startError(name string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return errorf(errdefs.ErrInternal, "starting %s: %v", name, err)
	}
	switch errno {
	case syscall.ENOENT, syscall.ENOTDIR:
		return errorf(errdefs.ErrNotFound, "starting %s: executable not found", name)
	case syscall.EACCES, syscall.EPERM:
		return errorf(errdefs.ErrPermissionDenied, "starting %s: %v", name, errno)
	case syscall.ENOEXEC, syscall.EISDIR, syscall.ELIBBAD:
		return errorf(errdefs.ErrFailedPrecondition, "starting %s: %v", name, errno)
	case syscall.E2BIG, syscall.EINVAL, syscall.ENAMETOOLONG:
		return errorf(errdefs.ErrInvalidArgument, "starting %s: %v", name, errno)
	case syscall.EAGAIN, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE:
		return errorf(errdefs.ErrResourceExhausted, "starting %s: %v", name, errno)
	default:
		return errorf(errdefs.ErrInternal, "starting %s: %v", name, errno)
	}
}

// monitor owns p from start to finish: it runs the output pumps, collects
// the exit status, bounds the output drain, and finally publishes the exit
// and files p in the table. fed, when not nil, is closed by the stdin
// feeder once it is done.
func (t *procTable) monitor(p *process, fed chan struct{}) {
	defer t.wg.Done()

	pumped := make(chan struct{}, len(p.outputs))
	for _, o := range p.outputs {
		go t.pump(p, o, pumped)
	}

	ws, ok := t.wait(p)
	p.mu.Lock()
	p.reaped = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.exit = exitStatusOf(ws, ok, p.timedOut)
	p.exitedAt = time.Now().UTC()
	p.mu.Unlock()
	if !ok {
		t.log.Error("exit status lost", "pid", p.pid)
	}

	// Output normally ends with the process (a terminal's master reads
	// EIO once the last holder of the tty is gone). Grandchildren that
	// inherited the pipes or the tty get drainTimeout; then the pumps take
	// what is buffered, which includes everything the process itself
	// wrote, and stop.
	deadline := time.Now().Add(drainTimeout)
	for _, o := range p.outputs {
		if err := o.f.SetReadDeadline(deadline); err != nil {
			// Not pollable (never for os.Pipe or /dev/ptmx): cut it off
			// instead.
			time.AfterFunc(drainTimeout, func() { o.f.Close() })
		}
	}
	for range p.outputs {
		<-pumped
	}
	if p.stdin != nil {
		p.stdin.shut() // unblocks a feeder or writer that nobody reads from
	}
	for _, o := range p.outputs {
		o.f.Close()
	}
	if fed != nil {
		<-fed
	}
	if p.out != nil {
		p.out.close()
	}
	t.file(p)
	close(p.done)
	if p.sub != nil {
		close(p.sub.ch)
	}
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

// wait returns the exit status of p, or false when it cannot be known.
func (t *procTable) wait(p *process) (syscall.WaitStatus, bool) {
	if t.reaper != nil {
		return <-p.status, true
	}
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(p.pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		return ws, err == nil
	}
}

func exitStatusOf(ws syscall.WaitStatus, ok, timedOut bool) exitStatus {
	switch {
	case !ok:
		return exitStatus{lost: true, timedOut: timedOut}
	case ws.Signaled():
		return exitStatus{code: 128 + int(ws.Signal()), signal: unix.SignalName(ws.Signal()), timedOut: timedOut}
	default:
		return exitStatus{code: ws.ExitStatus(), timedOut: timedOut}
	}
}

// pump copies one output stream of p to its subscriber or log until EOF,
// or until the read deadline the monitor sets after exit has passed and
// the data still buffered is passed on.
func (t *procTable) pump(p *process, o output, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	bp := t.bufs.Get().(*[]byte)
	defer t.bufs.Put(bp)
	buf := *bp
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			p.publish(o.id, buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drainBuffered(o.f, buf, func(b []byte) { p.publish(o.id, b) })
			return
		}
		if err != nil {
			return // EOF, or EIO from a terminal whose tty is closed
		}
	}
}

// drainBuffered passes on what the pipe f holds right now, without
// waiting for more: a slow reader must not lose output that the process
// wrote before it exited, and a grandchild that keeps writing must not
// keep the stream open.
func drainBuffered(f *os.File, buf []byte, emit func([]byte)) {
	rc, err := f.SyscallConn()
	if err != nil || f.SetReadDeadline(time.Time{}) != nil {
		return
	}
	var pending int // TIOCINQ is FIONREAD: bytes waiting in the pipe
	if rc.Control(func(fd uintptr) { pending, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }) != nil || err != nil {
		return
	}
	for pending > 0 {
		var n int
		// The fd is non-blocking: a read of an empty pipe fails with
		// EAGAIN instead of waiting, and returning true never waits.
		if rc.Read(func(fd uintptr) bool { n, err = unix.Read(int(fd), buf[:min(len(buf), pending)]); return true }) != nil || err != nil || n <= 0 {
			return
		}
		emit(buf[:n])
		pending -= n
	}
}

// publish passes data on. A background process appends it to its log,
// which never waits. A foreground process hands a copy to its subscriber
// and waits until it is taken (or the subscriber is gone): output is
// backpressured to the process through the pipe rather than buffered
// here.
func (p *process) publish(id streamID, data []byte) {
	if p.out != nil {
		p.out.write(id, data)
		return
	}
	p.written.Add(int64(len(data)))
	c := chunk{stream: id, data: append([]byte(nil), data...)}
	select {
	case p.sub.ch <- c:
	case <-p.sub.gone:
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
