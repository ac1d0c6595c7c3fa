// Package memfd keeps executables in sealed in-memory files, which run
// without a file on disk and which nothing can change once sealed.
package memfd

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Seals are the seals Sealed applies: the file cannot be written, grown,
// shrunk or unsealed. runc takes a memfd with exactly these for a safe
// copy of itself.
const Seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE

// Sealed returns a close-on-exec memfd named name holding what src
// reads, executable (mode 0555) and sealed against writing, growing,
// shrinking and further sealing.
func Sealed(name string, src io.Reader) (*os.File, error) {
	// MFD_EXEC: executable whatever vm.memfd_noexec says (Linux 6.3;
	// earlier kernels refuse the flag and allow execution anyway).
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("creating memfd %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("filling memfd %s: %w", name, err)
	}
	if err := f.Chmod(0o555); err != nil {
		f.Close()
		return nil, fmt.Errorf("making memfd %s executable: %w", name, err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, Seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("sealing memfd %s: %w", name, err)
	}
	return f, nil
}
