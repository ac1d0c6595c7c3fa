package agentserver

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// spawn forks and execs spec with fresh pipes or a fresh terminal. The
// child's ends are closed once the fork is done; on failure the parent's
// ends are closed too, so that nothing is left open.
func (t *procTable) spawn(spec procSpec) (_ *process, err error) {
	p := &process{
		argv:       spec.argv,
		dir:        spec.dir,
		user:       spec.user,
		tag:        spec.tag,
		background: spec.background,
		done:       make(chan struct{}),
	}
	var sio stdio
	defer func() {
		closeFiles(sio.child)
		if err != nil {
			closeFiles(sio.parent)
		}
	}()
	if spec.term != nil {
		err = sio.openTerminal(p, spec)
	} else {
		err = sio.openPipes(p, spec)
	}
	if err != nil {
		return nil, err
	}

	attr := &syscall.ProcAttr{Dir: spec.dir, Env: spec.env, Files: sio.files, Sys: sio.sys}
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

// stdio is what spawn opens for a child's standard streams: the ends the
// agent keeps, the ends the child gets, the child's fds 0 to 2 and how
// the child is attached to its process group and terminal.
type stdio struct {
	parent, child []*os.File
	files         []uintptr
	sys           *syscall.SysProcAttr
}

// openTerminal gives the child a new terminal of spec.term's size as
// stdin, stdout and stderr, and p the terminal's master.
func (s *stdio) openTerminal(p *process, spec procSpec) error {
	master, tty, err := openPTY(*spec.term, spec.cred)
	if err != nil {
		return err
	}
	s.parent, s.child = append(s.parent, master), append(s.child, tty)
	p.term = master
	p.outputs = []output{{f: master, id: streamStdout}}
	p.stdin = newStdinPipe(master, true)
	s.files = []uintptr{tty.Fd(), tty.Fd(), tty.Fd()}
	// A new session with the terminal as its controlling tty: job
	// control and ^C work as in a login. The session leader also
	// leads its process group, so signals to -pid still reach it all.
	s.sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: spec.cred}
	return nil
}

// openPipes gives the child a pipe (or /dev/null) as stdin and one pipe
// each for stdout and stderr, in a new process group.
func (s *stdio) openPipes(p *process, spec procSpec) error {
	var stdinChild *os.File
	if spec.stdin != nil || spec.openStdin {
		r, w, err := s.pipe(true)
		if err != nil {
			return err
		}
		stdinChild = r
		p.stdin = newStdinPipe(w, false)
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return errorf(errdefs.ErrInternal, "opening %s: %v", os.DevNull, err)
		}
		stdinChild = f
		s.child = append(s.child, f)
	}
	outR, outW, err := s.pipe(false)
	if err != nil {
		return err
	}
	errR, errW, err := s.pipe(false)
	if err != nil {
		return err
	}
	p.outputs = []output{{f: outR, id: streamStdout}, {f: errR, id: streamStderr}}
	// Fd puts the child ends in blocking mode, as a child expects; the
	// parent ends stay non-blocking so that Close interrupts a pending
	// Read.
	s.files = []uintptr{stdinChild.Fd(), outW.Fd(), errW.Fd()}
	s.sys = &syscall.SysProcAttr{Setpgid: true, Credential: spec.cred}
	return nil
}

// pipe makes a pipe and records its ends: the read end is the child's
// when childReads (stdin), else the write end (stdout, stderr).
func (s *stdio) pipe(childReads bool) (r, w *os.File, err error) {
	r, w, err = os.Pipe()
	if err != nil {
		return nil, nil, errorf(errdefs.ErrResourceExhausted, "creating pipe: %v", err)
	}
	if childReads {
		s.child, s.parent = append(s.child, r), append(s.parent, w)
	} else {
		s.child, s.parent = append(s.child, w), append(s.parent, r)
	}
	return r, w, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
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
