package agentd

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
)

const (
	// drainTimeout bounds how long a process's output is awaited after it
	// exited: background grandchildren may keep the pipes open forever.
	drainTimeout = 50 * time.Millisecond
	// readBufSize is the largest output chunk one event carries.
	readBufSize = 32 << 10
)

// procSpec is a validated exec request, ready to start.
type procSpec struct {
	path    string // executable, resolved through PATH
	argv    []string
	env     []string
	dir     string
	cred    *syscall.Credential // nil: run as the agent's own user
	stdin   []byte              // nil: /dev/null
	timeout time.Duration       // 0: none
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

// subscriber receives the output of one process. The process closes ch after
// the last chunk, once the exit status is known (done is closed then); the
// subscriber calls stop when it stops reading so that output never blocks on
// it.
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

// process is one process started by the agent, with its output fan-out and,
// once it exited, its kept exit status.
type process struct {
	pid    int
	subs   []*subscriber // fixed when the process starts
	stdout *os.File      // read ends owned by the pumps and the monitor
	stderr *os.File
	stdin  *os.File // write end owned by the feeder; nil for /dev/null
	status <-chan syscall.WaitStatus

	mu       sync.Mutex
	reaped   bool
	timedOut bool
	timer    *time.Timer

	done chan struct{} // closed once exit is set and output has ended
	exit exitStatus
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

// procTable holds the processes the agent started, by pid. It owns every
// goroutine that serves them and, under Init, the reaper.
type procTable struct {
	log    *slog.Logger
	reaper *reaper // nil: wait for each pid directly
	bufs   sync.Pool

	mu     sync.Mutex
	closed bool
	procs  map[int]*process
	wg     sync.WaitGroup // one count per started process, until done
}

func newProcTable(log *slog.Logger, r *reaper) *procTable {
	t := &procTable{log: log, reaper: r, procs: make(map[int]*process)}
	t.bufs.New = func() any { b := make([]byte, readBufSize); return &b }
	return t
}

// start starts spec in a new process group with subs receiving its output.
// A process that cannot start returns an errdefs error and leaves nothing
// behind. Cost: one fork/exec, three pipes' worth of fds and three
// goroutines (monitor and two output pumps) per running process, plus a
// feeder when stdin is given.
func (t *procTable) start(spec procSpec, subs ...*subscriber) (*process, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errShuttingDown
	}
	t.wg.Add(1)
	t.mu.Unlock()

	p, err := t.spawn(spec, subs)
	if err != nil {
		t.wg.Done()
		return nil, err
	}

	t.mu.Lock()
	t.procs[p.pid] = p
	closed := t.closed
	t.mu.Unlock()
	if spec.timeout > 0 {
		p.mu.Lock()
		p.timer = time.AfterFunc(spec.timeout, p.onTimeout)
		p.mu.Unlock()
	}
	go t.monitor(p, spec.stdin)
	if closed {
		p.kill() // close ran while we were forking and could not see p
	}
	return p, nil
}

// spawn forks and execs spec with fresh pipes.
func (t *procTable) spawn(spec procSpec, subs []*subscriber) (_ *process, err error) {
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

	var stdinChild, stdinParent *os.File
	if spec.stdin != nil {
		r, w, err := pipe()
		if err != nil {
			return nil, err
		}
		stdinChild, stdinParent = r, w
		childEnds, parentEnds = append(childEnds, r), append(parentEnds, w)
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

	// Fd puts the child ends in blocking mode, as a child expects; the
	// parent ends stay non-blocking so that Close interrupts a pending Read.
	attr := &syscall.ProcAttr{
		Dir:   spec.dir,
		Env:   spec.env,
		Files: []uintptr{stdinChild.Fd(), outW.Fd(), errW.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: spec.cred},
	}
	pid, err := syscall.ForkExec(spec.path, spec.argv, attr)
	if err != nil {
		return nil, startError(spec.argv[0], err)
	}
	p := &process{
		pid:    pid,
		subs:   subs,
		stdout: outR,
		stderr: errR,
		stdin:  stdinParent,
		done:   make(chan struct{}),
	}
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

// monitor owns p from start to finish: it runs the output pumps and the
// stdin feeder, collects the exit status, bounds the output drain, and
// finally publishes the exit and removes p from the table.
func (t *procTable) monitor(p *process, stdin []byte) {
	defer t.wg.Done()

	pumped := make(chan struct{}, 2)
	go t.pump(p, p.stdout, streamStdout, pumped)
	go t.pump(p, p.stderr, streamStderr, pumped)
	var fed chan struct{}
	if p.stdin != nil {
		fed = make(chan struct{})
		go feed(p.stdin, stdin, fed)
	}

	ws, ok := t.wait(p)
	p.mu.Lock()
	p.reaped = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.exit = exitStatusOf(ws, ok, p.timedOut)
	p.mu.Unlock()
	if !ok {
		t.log.Error("exit status lost", "pid", p.pid)
	}

	// Output normally ends with the process. Grandchildren that inherited
	// the pipes get drainTimeout; then the pumps take what is buffered in
	// the pipes, which includes everything the process itself wrote, and
	// stop.
	deadline := time.Now().Add(drainTimeout)
	for _, f := range []*os.File{p.stdout, p.stderr} {
		if err := f.SetReadDeadline(deadline); err != nil {
			// Not pollable (never for os.Pipe): cut it off instead.
			time.AfterFunc(drainTimeout, func() { f.Close() })
		}
	}
	<-pumped
	<-pumped
	p.stdout.Close()
	p.stderr.Close()
	if fed != nil {
		p.stdin.Close() // unblocks a feeder that nobody reads from
		<-fed
	}

	t.mu.Lock()
	delete(t.procs, p.pid)
	t.mu.Unlock()
	close(p.done)
	for _, s := range p.subs {
		close(s.ch)
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

// pump copies one output stream of p to its subscribers until EOF, or
// until the read deadline the monitor sets after exit has passed and the
// data still buffered in the pipe is passed on.
func (t *procTable) pump(p *process, f *os.File, id streamID, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	bp := t.bufs.Get().(*[]byte)
	defer t.bufs.Put(bp)
	buf := *bp
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.publish(id, buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drainBuffered(f, buf, func(b []byte) { p.publish(id, b) })
			return
		}
		if err != nil {
			return
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

// publish hands a copy of data to every subscriber that still listens,
// waiting for each: output is backpressured to the process through the
// pipe rather than buffered here.
func (p *process) publish(id streamID, data []byte) {
	c := chunk{stream: id, data: append([]byte(nil), data...)}
	for _, s := range p.subs {
		select {
		case s.ch <- c:
		case <-s.gone:
		}
	}
}

// feed writes data to a process's stdin and closes it. A write error means
// the reader went away, and there is nobody to tell.
func feed(w *os.File, data []byte, done chan<- struct{}) {
	defer close(done)
	_, _ = w.Write(data)
	w.Close()
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
