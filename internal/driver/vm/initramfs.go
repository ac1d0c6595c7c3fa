package vm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/corralrun/corral/internal/cpio"
	"github.com/corralrun/corral/internal/vmguest"
)

// initramfs returns the path of the initramfs for kernel k and the agent
// binary at agent, building it under dir when no current one is there.
// Its name holds a digest of everything in it, so a new agent or kernel
// gets a new file and a file, once renamed into place, never changes.
func initramfs(dir string, k Kernel, agent string) (string, error) {
	bin, err := os.ReadFile(agent)
	if err != nil {
		return "", fmt.Errorf("reading the agent binary: %w", err)
	}
	h := sha256.New()
	h.Write(bin)
	mods := make([][]byte, len(k.Modules))
	for i, m := range k.Modules {
		if mods[i], err = os.ReadFile(m); err != nil {
			return "", fmt.Errorf("reading module: %w", err)
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00", filepath.Base(m), len(mods[i]))
		h.Write(mods[i])
	}
	name := filepath.Join(dir, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:24]+".cpio")
	if _, err := os.Stat(name); err == nil {
		return name, nil
	}
	tmp, err := os.CreateTemp(dir, ".initramfs-*")
	if err != nil {
		return "", fmt.Errorf("creating initramfs: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = writeInitramfs(tmp, bin, k.Modules, mods)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), name)
	}
	if err != nil {
		return "", fmt.Errorf("writing initramfs: %w", err)
	}
	return name, nil
}

// writeInitramfs writes the archive vmguest.Boot expects: the agent at
// vmguest.AgentPath, the modules in /lib/modules and their load order in
// vmguest.ModulesFile.
func writeInitramfs(w io.Writer, agent []byte, files []string, mods [][]byte) error {
	cw := cpio.NewWriter(w)
	if err := cw.File(strings.TrimPrefix(vmguest.AgentPath, "/"), 0o755, agent); err != nil {
		return err
	}
	for _, d := range []string{"lib", "lib/modules"} {
		if err := cw.Dir(d, 0o755); err != nil {
			return err
		}
	}
	var list strings.Builder
	for i, f := range files {
		p := path.Join("lib/modules", filepath.Base(f))
		if err := cw.File(p, 0o644, mods[i]); err != nil {
			return err
		}
		list.WriteString("/" + p + "\n")
	}
	if err := cw.File(strings.TrimPrefix(vmguest.ModulesFile, "/"), 0o644, []byte(list.String())); err != nil {
		return err
	}
	return cw.Close()
}
