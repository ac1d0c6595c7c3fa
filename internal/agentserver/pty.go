package agentserver

import (
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

const (
	// defaultTerm is TERM for a process on a PTY unless the request sets it.
	defaultTerm = "xterm-256color"
	// Terminal size used for a zero dimension in a request.
	defaultCols, defaultRows = 80, 24
)

// openPTY allocates a pseudo-terminal of the given size, the Unix98 way
// (pts(4)): open /dev/ptmx, unlock the peer, learn its number, open
// /dev/pts/N. The master is non-blocking, so reads wait in the runtime's
// poller and Close interrupts them. With cred, the tty is handed to that
// user as login(1) would (owner uid, mode 0620), so the user's programs
// may change its modes.
func openPTY(size wire.PTYSize, cred *syscall.Credential) (master, tty *os.File, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, ptyError("opening /dev/ptmx", err)
	}
	master = os.NewFile(uintptr(mfd), "/dev/ptmx")
	defer func() {
		if err != nil {
			master.Close()
		}
	}()
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, ptyError("unlocking pseudo-terminal", err)
	}
	n, err := unix.IoctlGetUint32(mfd, unix.TIOCGPTN)
	if err != nil {
		return nil, nil, ptyError("reading pseudo-terminal number", err)
	}
	if err := setWinsize(mfd, size); err != nil {
		return nil, nil, ptyError("setting terminal size", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	sfd, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, ptyError("opening "+name, err)
	}
	tty = os.NewFile(uintptr(sfd), name)
	if cred != nil {
		if err := unix.Fchown(sfd, int(cred.Uid), -1); err == nil {
			_ = unix.Fchmod(sfd, 0o620)
		}
	}
	return master, tty, nil
}

// setWinsize sets the terminal size on fd (either end); the kernel sends
// SIGWINCH to the terminal's foreground process group when it changes.
func setWinsize(fd int, size wire.PTYSize) error {
	cols, rows := size.Cols, size.Rows
	if cols == 0 {
		cols = defaultCols
	}
	if rows == 0 {
		rows = defaultRows
	}
	return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// resize changes the size of p's terminal.
func (p *process) resize(size wire.PTYSize) error {
	if p.term == nil {
		return errorf(errdefs.ErrFailedPrecondition, "resizing process %d: it has no terminal", p.pid)
	}
	rc, err := p.term.SyscallConn()
	if err != nil {
		return errorf(errdefs.ErrInternal, "resizing process %d: %v", p.pid, err)
	}
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) { ioctlErr = setWinsize(int(fd), size) }); err != nil {
		// The master is closed: the process has exited.
		return errorf(errdefs.ErrFailedPrecondition, "resizing process %d: process has exited", p.pid)
	}
	if ioctlErr != nil {
		return errorf(errdefs.ErrInternal, "resizing process %d: %s", p.pid, errnoText(ioctlErr))
	}
	return nil
}

// ptyError classifies a failure to allocate a terminal.
func ptyError(action string, err error) error {
	kind := errdefs.ErrInternal
	switch err {
	case syscall.ENOENT, syscall.ENODEV, syscall.ENXIO:
		kind = errdefs.ErrFailedPrecondition // no devpts in this sandbox
	case syscall.EMFILE, syscall.ENFILE, syscall.ENOSPC:
		kind = errdefs.ErrResourceExhausted
	}
	return errorf(kind, "allocating a terminal: %s: %s", action, errnoText(err))
}
