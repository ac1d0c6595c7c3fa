package vm

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
)

// guestModules are the modules the guest needs before its agent serves:
// the virtio transport of the microvm machine (MMIO), the root disk, the
// agent's serial port and the network device. Their dependencies come from the modules'
// own .modinfo; ext4 is built into the kernels this driver supports.
var guestModules = []string{"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net"}

// Kernel is a guest kernel unpacked from a Debian linux-image package
// (`dpkg-deb -x`): boot/vmlinuz-<version> and its modules under
// lib/modules/<version>.
type Kernel struct {
	Version string
	// Image is the bzImage the VM boots.
	Image string
	// Modules are the module files to load, dependencies first.
	Modules []string
}

// FindKernel returns the newest kernel in dir that has the modules the
// guest needs. The error wraps errdefs.ErrFailedPrecondition when there
// is none.
func FindKernel(dir string) (Kernel, error) {
	images, err := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if err != nil || len(images) == 0 {
		return Kernel{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "no guest kernel in %s (scripts/deps.sh unpacks linux-image-cloud-amd64 there)", dir)
	}
	// Debian's versions sort well enough by name within one ABI series;
	// the newest is tried first.
	slices.Sort(images)
	var errs []error
	for _, image := range slices.Backward(images) {
		version := strings.TrimPrefix(filepath.Base(image), "vmlinuz-")
		mods, err := resolveModules(filepath.Join(dir, "lib", "modules", version), guestModules)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return Kernel{Version: version, Image: image, Modules: mods}, nil
	}
	return Kernel{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "no usable guest kernel in %s: %v", dir, errors.Join(errs...))
}

// resolveModules returns the files of the modules named wanted, found
// under dir, with everything they depend on, each after its
// dependencies. A wanted module that the kernel has built in
// (modules.builtin) is left out.
func resolveModules(dir string, wanted []string) ([]string, error) {
	files := map[string]string{}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name, ok := strings.CutSuffix(e.Name(), ".ko"); ok && e.Type().IsRegular() {
			files[moduleName(name)] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing modules of %s: %w", dir, err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[moduleName(strings.TrimSuffix(filepath.Base(l), ".ko"))] = true
		}
	}
	var order []string
	state := map[string]int{} // 1: being visited, 2: done
	var visit func(name string) error
	visit = func(name string) error {
		name = moduleName(name)
		switch state[name] {
		case 1:
			return fmt.Errorf("module %s depends on itself", name)
		case 2:
			return nil
		}
		if builtin[name] {
			state[name] = 2
			return nil
		}
		file, ok := files[name]
		if !ok {
			return fmt.Errorf("module %s is not in %s", name, dir)
		}
		state[name] = 1
		deps, err := moduleDeps(file)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, file)
		return nil
	}
	for _, w := range wanted {
		if err := visit(w); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleName is the kernel's name of a module: file names may use "-"
// where the kernel uses "_".
func moduleName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// moduleDeps reads the "depends=" entry of a module's .modinfo section,
// NUL-separated key=value strings that modpost writes.
func moduleDeps(file string) ([]string, error) {
	f, err := elf.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading module %s: %w", file, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s has no .modinfo section", file)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("reading .modinfo of %s: %w", file, err)
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, d)
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}
