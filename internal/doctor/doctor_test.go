package doctor

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/driver/vm"
	"github.com/corralrun/corral/internal/testutil"
)

type fakeInfo struct{ os.FileInfo }

// fakeHost is a host with the given files, binaries and command outputs.
func fakeHost(files map[string]string, bins map[string]string) Host {
	return Host{
		Geteuid: func() int { return 0 },
		ReadFile: func(name string) ([]byte, error) {
			if s, ok := files[name]; ok {
				return []byte(s), nil
			}
			return nil, fs.ErrNotExist
		},
		Stat: func(name string) (os.FileInfo, error) {
			if _, ok := files[name]; ok {
				return fakeInfo{}, nil
			}
			return nil, fs.ErrNotExist
		},
		Glob: func(pattern string) ([]string, error) {
			var names []string
			for name := range files {
				if ok, _ := filepath.Match(pattern, name); ok {
					names = append(names, name)
				}
			}
			return names, nil
		},
		LookPath: func(file string) (string, error) {
			if _, ok := bins[file]; ok {
				return "/usr/bin/" + file, nil
			}
			return "", errors.New("not found")
		},
		Output: func(_ context.Context, name string, _ ...string) ([]byte, error) {
			for b, out := range bins {
				if "/usr/bin/"+b == name {
					return []byte(out), nil
				}
			}
			return nil, errors.New("no such command")
		},
		OpenRW: func(name string) error {
			if _, ok := files[name]; ok {
				return nil
			}
			return fs.ErrPermission
		},
	}
}

func runtimes(r Report) map[string]Runtime {
	m := map[string]Runtime{}
	for _, rt := range append(r.Runtimes, r.Storage...) {
		m[rt.Name] = rt
	}
	return m
}

func TestThisMachineKind(t *testing.T) {
	// Facts of this project's machines: cgroup v1, btrfs and overlay built
	// in, runc and the pinned runsc installed; and, for the doctor's sake,
	// /dev/kvm present but QEMU not installed.
	files := map[string]string{
		"/proc/filesystems":     "nodev\tsysfs\nnodev\toverlay\n\tbtrfs\n\text4\n",
		"/sys/fs/cgroup/memory": "", "/sys/fs/cgroup/cpu": "", "/sys/fs/cgroup/pids": "",
		"/sys/fs/cgroup/freezer": "", "/dev/kvm": "",
	}
	bins := map[string]string{
		"runc": "runc version 1.1.5", "runsc": "runsc version " + RunscVersion + "\nspec: 1.2.1",
		"mkfs.btrfs": "mkfs.btrfs, part of btrfs-progs v6.2", "debootstrap": "",
	}
	r := Run(t.Context(), fakeHost(files, bins))
	rt := runtimes(r)
	for name, want := range map[string]bool{"runc": true, "gvisor": true, "vm": false, "btrfs": true, "overlay": true} {
		if rt[name].Available != want {
			t.Errorf("%s available = %v, want %v (needs %v)", name, rt[name].Available, want, rt[name].Needs)
		}
	}
	if got, want := rt["vm"].Needs, []string{"qemu-system-x86_64", "qemu-img", "mkfs.ext4", "vm-kernel"}; !slices.Equal(got, want) {
		t.Errorf("vm needs %v, want %v", got, want)
	}
	if got := rt["vm"].Note; !strings.Contains(got, "KVM") || strings.Contains(got, "TCG") {
		t.Errorf("vm note %q with /dev/kvm usable", got)
	}
	for _, c := range r.Checks {
		if !c.OK && c.Fix == "" {
			t.Errorf("failed check %s has no fix", c.Name)
		}
	}
}

// TestVMWithoutKVM: with QEMU, qemu-img, mkfs.ext4 and the guest kernel
// but no /dev/kvm, the vm runtime is available and says it emulates.
func TestVMWithoutKVM(t *testing.T) {
	files := map[string]string{
		"/sys/fs/cgroup/memory": "", "/sys/fs/cgroup/cpu": "", "/sys/fs/cgroup/pids": "", "/sys/fs/cgroup/freezer": "",
		vm.DefaultKernelDir + "/boot/vmlinuz-6.1.0-57-cloud-amd64": "",
	}
	bins := map[string]string{"qemu-system-x86_64": "QEMU emulator version 7.2.22", "qemu-img": "", "mkfs.ext4": ""}
	rt := runtimes(Run(t.Context(), fakeHost(files, bins)))["vm"]
	if !rt.Available || !strings.Contains(rt.Note, "TCG") {
		t.Errorf("vm = %+v, want available under TCG", rt)
	}
	delete(files, vm.DefaultKernelDir+"/boot/vmlinuz-6.1.0-57-cloud-amd64")
	if rt := runtimes(Run(t.Context(), fakeHost(files, bins)))["vm"]; rt.Available || !slices.Equal(rt.Needs, []string{"vm-kernel"}) {
		t.Errorf("vm without a kernel = %+v, want it to need vm-kernel", rt)
	}
}

func TestQuotaCheck(t *testing.T) {
	const a, b = "/sys/fs/btrfs/aaaa/qgroups/", "/sys/fs/btrfs/bbbb/qgroups/"
	tests := []struct {
		name   string
		files  map[string]string
		ok     bool
		detail string
	}{
		{"no quotas", map[string]string{}, true, "no btrfs filesystem has quotas on"},
		{"consistent", map[string]string{a + "inconsistent": "0\n", a + "mode": "squota\n", b + "inconsistent": "0\n", b + "mode": "qgroup\n"},
			true, "consistent on 2 btrfs filesystems (simple quotas: 1, full: 1)"},
		{"inconsistent", map[string]string{a + "inconsistent": "0\n", b + "inconsistent": "1\n", b + "mode": "qgroup\n"},
			false, "accounting inconsistent, disk limits not enforced, on btrfs bbbb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := quotaCheck(fakeHost(tt.files, nil))
			if c.OK != tt.ok || c.Detail != tt.detail {
				t.Errorf("quotaCheck = %v %q, want %v %q", c.OK, c.Detail, tt.ok, tt.detail)
			}
		})
	}
}

func TestMissingPieces(t *testing.T) {
	files := map[string]string{
		"/proc/filesystems":                 "nodev\toverlay\n",
		"/sys/fs/cgroup/cgroup.controllers": "cpu io",
	}
	bins := map[string]string{"runsc": "runsc version release-20220101.0"}
	h := fakeHost(files, bins)
	h.Geteuid = func() int { return 1000 }
	r := Run(t.Context(), h)
	rt := runtimes(r)
	if rt["runc"].Available || rt["gvisor"].Available || rt["btrfs"].Available {
		t.Fatalf("runtimes available on a host missing everything: %+v", rt)
	}
	checks := map[string]Check{}
	for _, c := range r.Checks {
		checks[c.Name] = c
	}
	if c := checks["cgroups"]; c.OK || c.Detail != "cgroup v2, controllers: cpu io; missing: memory pids" {
		t.Errorf("cgroups: %+v", c)
	}
	if c := checks["runsc"]; c.OK || c.Detail != "/usr/bin/runsc: runsc version release-20220101.0 (want "+RunscVersion+")" {
		t.Errorf("runsc: %+v", c)
	}
	if c := checks["kvm"]; c.OK {
		t.Errorf("kvm: %+v", c)
	}
}

// TestRealHost runs the doctor on this machine: runc must be usable where
// the tests run (CI installs it).
func TestRealHost(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	start := time.Now()
	r := Run(t.Context(), RealHost())
	if d := time.Since(start); d > 3*time.Second {
		t.Logf("doctor took %s", d)
	}
	if rt := runtimes(r); !rt["runc"].Available || !rt["overlay"].Available {
		t.Fatalf("runc/overlay not available on the test machine: %+v\n%+v", rt, r.Checks)
	}
}
