// Package cpio writes archives in the "newc" format (SVR4 portable ASCII
// cpio without checksums), the format Linux unpacks as an initramfs.
//
// It writes only: directories, regular files and symlinks, each given in
// full by the caller, with no hard links and no device nodes (devtmpfs
// provides those at boot). It does not read the host file system.
package cpio

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
)

// The newc header ("070701") is 13 fields of 8 hexadecimal digits after
// the magic, then the NUL-terminated name, padded to a multiple of four
// bytes with the header; the data follows, padded the same way. The
// archive ends with an entry named "TRAILER!!!".
const (
	magic      = "070701"
	headerSize = 110
	trailer    = "TRAILER!!!"
)

// Mode bits of the entry types this writer knows (st_mode's S_IFMT).
const (
	modeDir     = 0o040000
	modeRegular = 0o100000
	modeSymlink = 0o120000
)

// Writer writes one archive. It is not safe for concurrent use.
type Writer struct {
	w     *bufio.Writer
	ino   uint32
	err   error
	ended bool
}

// NewWriter returns a Writer that writes the archive to w. Close writes
// the trailer and flushes; it does not close w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriter(w), ino: 1}
}

// Dir adds a directory owned by root. The kernel does not create missing
// parents, so a directory must come before anything in it.
func (w *Writer) Dir(name string, perm fs.FileMode) error {
	return w.entry(name, modeDir|uint32(perm.Perm()), nil)
}

// File adds a regular file owned by root with the contents data.
func (w *Writer) File(name string, perm fs.FileMode, data []byte) error {
	return w.entry(name, modeRegular|uint32(perm.Perm()), data)
}

// Symlink adds a symbolic link name pointing to target.
func (w *Writer) Symlink(name, target string) error {
	return w.entry(name, modeSymlink|0o777, []byte(target))
}

// Close ends the archive with its trailer and flushes the buffered
// output.
func (w *Writer) Close() error {
	if !w.ended {
		w.ended = true
		w.ino = 0
		if err := w.entry(trailer, 0, nil); err != nil {
			return err
		}
	}
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}

func (w *Writer) entry(name string, mode uint32, data []byte) error {
	if w.err != nil {
		return w.err
	}
	if w.ended && name != trailer {
		return fmt.Errorf("cpio: adding %s after Close", name)
	}
	if name == "" || name[0] == '/' {
		return fmt.Errorf("cpio: entry name %q must be relative", name)
	}
	nlink := 1
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	ino := w.ino
	if ino != 0 {
		w.ino++
	}
	// Fields: ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with its NUL), check.
	_, w.err = fmt.Fprintf(w.w, "%s%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		magic, ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	if w.err != nil {
		return w.err
	}
	w.write([]byte(name))
	w.write([]byte{0})
	w.pad(headerSize + len(name) + 1)
	w.write(data)
	w.pad(len(data))
	return w.err
}

func (w *Writer) write(b []byte) {
	if w.err == nil {
		_, w.err = w.w.Write(b)
	}
}

// pad writes the NULs that bring n written bytes to a multiple of four.
func (w *Writer) pad(n int) {
	if r := n % 4; r != 0 {
		w.write(make([]byte, 4-r))
	}
}
