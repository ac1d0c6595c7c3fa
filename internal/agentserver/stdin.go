package agentserver

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// eofChar is what closing a terminal's stdin sends: ^D, the default VEOF
// character, which ends input at the start of a line in canonical mode.
// Closing the master itself would hang up the whole session.
const eofChar = "\x04"

// stdinPipe is the write side of a process's stdin: a pipe's write end or
// a terminal's master. One writer at a time owns it (the feeder of the
// initial bytes, then one POST .../stdin after another), so that streams
// from different writers never interleave mid-chunk.
type stdinPipe struct {
	f    *os.File
	term bool
	// owner holds a token while someone writes.
	owner chan struct{}

	mu     sync.Mutex
	closed bool // no more writes: closed by request, or the process ended
}

func newStdinPipe(f *os.File, term bool) *stdinPipe {
	return &stdinPipe{f: f, term: term, owner: make(chan struct{}, 1)}
}

// feed writes the initial bytes and, when closeAfter, closes stdin. The
// caller has put the owner token in place; feed takes it back. A write
// error means the reader went away, and there is nobody to tell.
func (s *stdinPipe) feed(data []byte, closeAfter bool, done chan<- struct{}) {
	defer close(done)
	defer func() { <-s.owner }()
	_, _ = s.f.Write(data)
	if closeAfter {
		s.shut()
	}
}

// shut closes a pipe for good. For a terminal it only refuses further
// writes: the monitor closes the master itself once output has ended.
func (s *stdinPipe) shut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if !s.term {
		s.f.Close() // interrupts a write in progress
	}
}

func (s *stdinPipe) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// closeInput serves DELETE .../stdin: a pipe is closed, so the process
// reads EOF; a terminal gets the EOF character and stays usable.
func (s *stdinPipe) closeInput(pid int) error {
	if !s.term {
		if s.isClosed() {
			return errorf(errdefs.ErrFailedPrecondition, "closing stdin of process %d: already closed", pid)
		}
		s.shut()
		return nil
	}
	if s.isClosed() {
		return errorf(errdefs.ErrFailedPrecondition, "closing stdin of process %d: process has exited", pid)
	}
	if _, err := s.f.WriteString(eofChar); err != nil {
		return stdinError(pid, err)
	}
	return nil
}

// copyFrom writes what r yields to stdin as it arrives, chunk by chunk,
// until r ends, r fails, the process ends, or ctx ends (a write blocked
// on a process that does not read is then abandoned). It waits its turn
// behind other writers, giving up when ctx or done ends first.
func (s *stdinPipe) copyFrom(ctx context.Context, pid int, r io.Reader, done <-chan struct{}) error {
	select {
	case s.owner <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
		return errorf(errdefs.ErrFailedPrecondition, "writing to stdin of process %d: process has exited", pid)
	}
	defer func() { <-s.owner }()

	// A previous writer may have left an expired deadline behind.
	_ = s.f.SetWriteDeadline(time.Time{})
	stop := afterFunc(ctx, func() { _ = s.f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()

	buf := make([]byte, 32<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if s.isClosed() {
				return errorf(errdefs.ErrFailedPrecondition, "writing to stdin of process %d: stdin is closed", pid)
			}
			if _, err := s.f.Write(buf[:n]); err != nil {
				if ctxErr := ctx.Err(); ctxErr != nil {
					return ctxErr
				}
				return stdinError(pid, err)
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return errorf(errdefs.ErrInvalidArgument, "reading stdin for process %d: %v", pid, rerr)
		}
	}
}

// stdinError classifies a failed write to stdin.
func stdinError(pid int, err error) error {
	switch {
	case errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
		return errorf(errdefs.ErrFailedPrecondition, "writing to stdin of process %d: stdin is closed", pid)
	default:
		return errorf(errdefs.ErrInternal, "writing to stdin of process %d: %s", pid, errnoText(err))
	}
}
