package ocirt

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/memfd"
)

// runcSeals are the seals that make runc take a memfd for a safe copy of
// itself: it cannot be written, grown, shrunk or unsealed.
const runcSeals = memfd.Seals

// A Sealed is an executable kept as a sealed in-memory copy, which
// commands run instead of the file.
//
// For runc this saves work in every container start. Against
// CVE-2019-5736 (a container overwriting the host's runc through
// /proc/self/exe), runc makes sure that a container's init does not run
// the file itself: some builds bind-mount themselves read-only in every
// `runc init` and execute themselves a second time, other builds copy themselves into memory, and runc 1.2 and later mount a
// private overlay over the binary in `runc run` and `runc create`. Each
// skips its step when runc already runs from a memfd sealed with
// runcSeals, which nothing can change; runc's memfd-bind tool makes the
// same copy for this purpose.
//
// When the file changes (an upgrade), the next Path makes a new copy.
// Earlier copies stay open until Close: a command may still be starting
// from one, and a closed descriptor's number can be reused by another
// file. A file that cannot be copied (or is no longer an ELF binary) is
// run itself until it changes again.
type Sealed struct {
	path string

	mu     sync.Mutex
	cur    *os.File
	id     fileID // of the file cur copies
	failed fileID // of a version that could not be copied
	older  []*os.File
	closed bool
}

// fileID tells whether a file changed since it was copied. A change of
// owner or mode alone (ctime) is not a new binary.
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    unix.Timespec
}

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim}, nil
}

// NewSealed copies the executable at path, which must be an ELF binary,
// into a sealed memfd.
func NewSealed(path string) (*Sealed, error) {
	s := &Sealed{path: path}
	if _, err := s.Path(); err != nil {
		return nil, err
	}
	return s, nil
}

// Path returns a path that executes the current copy, made anew when the
// file changed: /proc/<pid>/fd/N of this process. (Not /proc/self: a
// child about to exec may already have moved another descriptor onto N,
// as Go's fork does with the ones it passes.) With an error it returns
// the file's own path: when the file cannot be copied, or after Close.
func (s *Sealed) Path() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.path, fmt.Errorf("copy of %s: closed", s.path)
	}
	id, err := statID(s.path)
	if err != nil {
		return s.path, fmt.Errorf("checking %s: %w", s.path, err)
	}
	if s.cur == nil || id != s.id {
		if id == s.failed {
			return s.path, fmt.Errorf("copying %s failed before", s.path)
		}
		f, err := sealedCopy(s.path, id)
		if err != nil {
			s.failed = id
			return s.path, err
		}
		if s.cur != nil {
			s.older = append(s.older, s.cur)
		}
		s.cur, s.id = f, id
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), s.cur.Fd()), nil
}

// Close closes every copy; Path then returns the file's own path.
func (s *Sealed) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range append(s.older, s.cur) {
		if f != nil {
			f.Close()
		}
	}
	s.cur, s.older, s.closed = nil, nil, true
	return nil
}

// sealedCopy copies the ELF binary at path, whose fileID was id, into a
// sealed memfd. A file that changed meanwhile is an error.
func sealedCopy(path string, id fileID) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(src, magic); err != nil || string(magic) != "\x7fELF" {
		// A script run through /proc/<pid>/fd/N would find that
		// descriptor closed (close-on-exec) by the time its
		// interpreter opens it.
		return nil, fmt.Errorf("%s is not an ELF executable", path)
	}
	f, err := memfd.Sealed(filepath.Base(path), io.MultiReader(bytes.NewReader(magic), src))
	if err != nil {
		return nil, fmt.Errorf("copying %s into memory: %w", path, err)
	}
	if after, err := statID(path); err != nil || after != id {
		f.Close()
		return nil, fmt.Errorf("copying %s into memory: it changed during the copy", path)
	}
	return f, nil
}
