package cli

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	corral "github.com/corralrun/corral/sdk"
)

// The terminal size of a session whose stdin is not a terminal.
const (
	defaultCols = 80
	defaultRows = 24
)

// terminalOf returns r as a file when it is a terminal, else nil.
func terminalOf(r io.Reader) *os.File {
	f, ok := r.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return f
}

// terminalSize returns tty's size, or 80x24 without a terminal.
func terminalSize(tty *os.File) corral.PTYSize {
	if tty == nil {
		return corral.PTYSize{Cols: defaultCols, Rows: defaultRows}
	}
	w, h, err := term.GetSize(int(tty.Fd()))
	if err != nil || w <= 0 || h <= 0 || w > 0xffff || h > 0xffff {
		return corral.PTYSize{Cols: defaultCols, Rows: defaultRows}
	}
	return corral.PTYSize{Cols: uint16(w), Rows: uint16(h)}
}

// watchResize sends tty's size on the returned channel whenever the
// terminal is resized (SIGWINCH), keeping only the latest unsent size.
// stop ends the watch and waits for its goroutine.
func watchResize(tty *os.File) (sizes <-chan corral.PTYSize, stop func()) {
	ch := make(chan corral.PTYSize, 1)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGWINCH)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-sig:
			}
			size := terminalSize(tty)
			select {
			case <-ch: // replaced by the newer size
			default:
			}
			ch <- size
		}
	}()
	return ch, func() {
		signal.Stop(sig)
		close(done)
		wg.Wait()
	}
}

// errInputCanceled ends a cancelable read; it is not io.EOF, so that the
// process's stdin is not closed because the local side stopped reading.
var errInputCanceled = errors.New("input canceled")

// cancelableInput reads a file descriptor until Cancel, which makes a
// blocked Read return errInputCanceled at once: the reader waits in poll(2)
// on the descriptor and on a pipe that Cancel writes to. This lets a
// session's stdin goroutine end with the session instead of waiting for the
// next key press.
type cancelableInput struct {
	fd   int
	wake [2]int // pipe: Cancel writes wake[1], Read polls wake[0]

	mu       sync.Mutex
	idle     *sync.Cond // signaled when reading drops to 0
	reading  int
	canceled bool
}

func newCancelableInput(f *os.File) (*cancelableInput, error) {
	c := &cancelableInput{fd: int(f.Fd())}
	c.idle = sync.NewCond(&c.mu)
	if err := unix.Pipe2(c.wake[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	return c, nil
}

// Read reads from the descriptor, returning io.EOF at its end and
// errInputCanceled once canceled.
func (c *cancelableInput) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.canceled {
		c.mu.Unlock()
		return 0, errInputCanceled
	}
	c.reading++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.reading--
		c.idle.Broadcast()
		c.mu.Unlock()
	}()
	for {
		fds := []unix.PollFd{
			{Fd: int32(c.fd), Events: unix.POLLIN},
			{Fd: int32(c.wake[0]), Events: unix.POLLIN},
		}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, os.NewSyscallError("poll", err)
		}
		if fds[1].Revents != 0 {
			return 0, errInputCanceled
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(c.fd, p)
		switch {
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue
		case err != nil:
			return 0, os.NewSyscallError("read", err)
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// Cancel makes every current and later Read return errInputCanceled.
func (c *cancelableInput) Cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.canceled {
		c.canceled = true
		_, _ = unix.Write(c.wake[1], []byte{0})
	}
}

// Close cancels, waits for Reads in progress to return and releases the
// wake pipe.
func (c *cancelableInput) Close() {
	c.Cancel()
	c.mu.Lock()
	for c.reading > 0 {
		c.idle.Wait()
	}
	c.mu.Unlock()
	unix.Close(c.wake[0])
	unix.Close(c.wake[1])
}

// detachKey (Ctrl-]) typed into `corral attach` on a terminal detaches,
// leaving the process running.
const detachKey = 0x1d

// detachInput passes input through until the detach key, then calls
// detach and ends with errInputCanceled.
type detachInput struct {
	r      io.Reader
	detach func()
	done   bool
}

func (d *detachInput) Read(p []byte) (int, error) {
	if d.done {
		return 0, errInputCanceled
	}
	n, err := d.r.Read(p)
	if i := bytes.IndexByte(p[:n], detachKey); i >= 0 {
		d.done = true
		d.detach()
		return i, nil
	}
	return n, err
}
