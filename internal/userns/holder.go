// Package userns makes user namespaces owned by a given host user with
// given ID maps, for runc to join and for ID-mapped mounts, at the cost of
// one small process each.
package userns

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"github.com/corralrun/corral/internal/memfd"
)

// The user namespace holder (NS) is a child process that only has to
// exist: it runs in the new namespace, exits, and its unreaped zombie
// keeps the namespace reachable by path. It runs as the namespace's
// owner.
//
// On amd64 the holder is a tiny program that makes the namespace itself
// with unshare(2) and exits. The Holder keeps it in a sealed memfd and the
// child execs it through /proc/self/fd, so no directory needs to be
// searchable by the owner or mounted with exec allowed (/run, where
// MountDir is by default, is noexec on many hosts). The daemon starts it as
// an ordinary child, which Go does with vfork, and waits for its exit.
// Elsewhere, or where the memfd cannot be executed, the daemon clones the
// child into a new namespace and it re-executes this binary. That costs
// more twice over: Go clones a process into a new user namespace with a
// full fork, copying the daemon's page tables, and this binary's start-up,
// Go runtime and every package's initialization, takes CPU on the cores
// that the create itself needs.

// holderFD is the holder's descriptor in the child (its first ExtraFiles
// entry).
const holderFD = 3

// Holder makes user namespaces with a holder program kept in a sealed
// memfd. A nil *Holder makes them by re-executing this binary.
type Holder struct{ prog *os.File }

// OpenHolder returns a Holder with the holder program in a sealed memfd,
// after running it once, or nil where there is no program for the
// architecture or the memfd cannot be executed (the error says why); a
// nil Holder still makes namespaces, more slowly.
func OpenHolder() (*Holder, error) {
	prog, err := openProgram()
	if err != nil {
		return nil, err
	}
	return &Holder{prog: prog}, nil
}

// Close releases the holder program; a nil h has nothing to release.
func (h *Holder) Close() error {
	if h == nil {
		return nil
	}
	return h.prog.Close()
}

func openProgram() (*os.File, error) {
	prog := holderProgram()
	if prog == nil {
		return nil, errors.New("no holder program for this architecture")
	}
	f, err := memfd.Sealed("corral-userns-holder", bytes.NewReader(prog))
	if err != nil {
		return nil, fmt.Errorf("preparing the user namespace holder: %w", err)
	}
	if out, err := holderCommand(f).CombinedOutput(); err != nil {
		f.Close()
		return nil, fmt.Errorf("preparing the user namespace holder: running it: %w %s", err, out)
	}
	return f, nil
}

// holderCommand returns the command that runs the holder program in
// holder.
func holderCommand(holder *os.File) *exec.Cmd {
	cmd := exec.Command("/proc/self/fd/" + strconv.Itoa(holderFD))
	cmd.ExtraFiles = []*os.File{holder}
	cmd.Env = []string{}
	return cmd
}

// exitELF returns a static 64-bit little-endian ELF executable for
// machine whose only instructions are code: one ELF header, one loadable
// segment (the whole file, read and execute) and the code right after
// them, where execution starts. code must end the process.
func exitELF(machine uint16, code []byte) []byte {
	const (
		base       = 0x400000 // where the segment is loaded
		headerSize = 64       // Elf64_Ehdr
		phSize     = 56       // Elf64_Phdr
	)
	le := binary.LittleEndian
	size := uint64(headerSize + phSize + len(code))
	b := []byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* little-endian */, 1 /* version */, 0 /* System V ABI */}
	b = append(b, make([]byte, 8)...) // ABI version, padding
	b = le.AppendUint16(b, 2)         // e_type: ET_EXEC
	b = le.AppendUint16(b, machine)   // e_machine
	b = le.AppendUint32(b, 1)         // e_version
	b = le.AppendUint64(b, base+headerSize+phSize)
	b = le.AppendUint64(b, headerSize) // e_phoff: the program header follows
	b = le.AppendUint64(b, 0)          // e_shoff: no section headers
	b = le.AppendUint32(b, 0)          // e_flags
	b = le.AppendUint16(b, headerSize) // e_ehsize
	b = le.AppendUint16(b, phSize)     // e_phentsize
	b = le.AppendUint16(b, 1)          // e_phnum
	b = le.AppendUint16(b, 0)          // e_shentsize
	b = le.AppendUint16(b, 0)          // e_shnum
	b = le.AppendUint16(b, 0)          // e_shstrndx
	b = le.AppendUint32(b, 1)          // p_type: PT_LOAD
	b = le.AppendUint32(b, 5)          // p_flags: read, execute
	b = le.AppendUint64(b, 0)          // p_offset
	b = le.AppendUint64(b, base)       // p_vaddr
	b = le.AppendUint64(b, base)       // p_paddr
	b = le.AppendUint64(b, size)       // p_filesz
	b = le.AppendUint64(b, size)       // p_memsz
	b = le.AppendUint64(b, 0x1000)     // p_align
	return append(b, code...)
}
