package runc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The user namespace holder (userNS) is a child process that only has to
// exist: it runs in the new namespace, exits, and its unreaped zombie
// keeps the namespace reachable by path. It runs as the namespace's
// owner, so it must be a file that user may execute.
//
// On amd64 the driver writes a program of 143 bytes to <MountDir>/.holder
// (MountDir is searchable by every user; the file is root's, mode 0755)
// that makes the namespace itself with unshare(2) and exits. The daemon
// starts it as an ordinary child, which Go does with vfork, and waits for
// its exit. Elsewhere the daemon clones the child into a new namespace and
// it re-executes this binary. That costs more twice over: Go clones a
// process into a new user namespace with a full fork, copying the
// daemon's page tables (1.35 ms against 0.7 ms here), and this binary's
// start-up, Go runtime and every package's initialization, takes about
// 8 ms of CPU on the cores that the create itself needs.

// holderName is the holder program's file in MountDir.
const holderName = ".holder"

// installHolder makes sure MountDir holds the holder program and returns
// its path, or "" on architectures without one.
func installHolder(mountDir string) (string, error) {
	prog := holderProgram()
	if prog == nil {
		return "", nil
	}
	path := filepath.Join(mountDir, holderName)
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, prog) {
		return path, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading user namespace holder: %w", err)
	}
	// Other daemons may exec the file at any time: replace it whole.
	tmp, err := os.CreateTemp(mountDir, holderName+".*")
	if err != nil {
		return "", fmt.Errorf("writing user namespace holder: %w", err)
	}
	_, err = tmp.Write(prog)
	err = errors.Join(err, tmp.Chmod(0o755), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("writing user namespace holder: %w", err)
	}
	return path, nil
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
