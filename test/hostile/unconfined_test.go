package hostile

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/runc"
	"github.com/corralrun/corral/internal/storage/btrfs"
	"github.com/corralrun/corral/internal/testutil"
)

type specsSpec = specs.Spec

func writeSpec(name string, s *specs.Spec) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(name, b, 0o600)
}

// allCaps is every capability up to CAP_CHECKPOINT_RESTORE (40) except
// CAP_SYS_RESOURCE, which host root itself may lack (a host that is itself
// a container without it), and runc cannot grant what it lacks.
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
	"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
	"CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// TestProbesWithoutConfinement shows that the syscall assertions of the
// hostile suite have teeth: the same probes, run by plain `runc run` in a
// container built from the driver's own OCI spec, fail as the suite
// expects; with the seccomp profile removed the ones that only seccomp
// stops get through; and with seccomp, the capability drop,
// no_new_privs and the read-only /proc paths all removed (a "privileged"
// container), every probe the suite expects to fail gets a different
// answer. A probe that needs an ability this host lacks (hostLacks) is
// only checked to fail when confined, and its subtest says why it is
// skipped. Every probe acts on objects of its own container, so a
// privileged run changes nothing outside it.
func TestProbesWithoutConfinement(t *testing.T) {
	requireHost(t)
	attack := buildAttack(t)
	rootfs := testutil.BusyboxRootfs(t)
	if err := os.WriteFile(filepath.Join(rootfs, "attack"), attack, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	state, err := os.MkdirTemp("", "corral-probes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	cgroup := "/corral-probes-" + randHex(4)
	t.Cleanup(func() {
		roots, _ := filepath.Glob("/sys/fs/cgroup/*")
		for _, r := range roots {
			os.Remove(filepath.Join(r, cgroup))
		}
	})
	// As the daemon configures it. The root here is not on btrfs, so the
	// subvolume ioctl gets ENOTTY from the kernel where seccomp does not
	// answer first.
	host := runc.Host{AgentPath: filepath.Join(rootfs, "attack"), CgroupParent: cgroup, Arch: runtime.GOARCH,
		OpenFiles: 4096, DenyIoctls: btrfs.SubvolumeIoctls()}

	run := func(name string, weaken func(spec *specsSpec)) map[string]string {
		t.Helper()
		id := name + "-" + randHex(4)
		spec := runc.OCISpec(driver.Spec{ID: id, RootFS: rootfs}, host, runc.UserNS{})
		spec.Process.Args = []string{"/attack", "probes", "999999"}
		spec.Process.Env = append(spec.Process.Env, "CORRAL_ATTACK_SANDBOXED=1")
		weaken(spec)
		bundle := t.TempDir()
		if err := writeSpec(filepath.Join(bundle, "config.json"), spec); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("runc", "--root", state, "run", "--bundle", bundle, id)
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("runc run (%s): %v\n%s\n%s", name, err, out, stderr)
		}
		return probes(string(out))
	}

	confined := run("confined", func(*specsSpec) {})
	noSeccomp := run("noseccomp", func(s *specsSpec) { s.Linux.Seccomp = nil })
	privileged := run("privileged", func(s *specsSpec) {
		s.Linux.Seccomp = nil
		s.Process.NoNewPrivileges = false
		s.Process.Capabilities.Bounding = allCaps
		s.Process.Capabilities.Effective = allCaps
		s.Process.Capabilities.Permitted = allCaps
		s.Linux.ReadonlyPaths = nil
		s.Linux.MaskedPaths = nil
	})

	var table strings.Builder
	fmt.Fprintf(&table, "%-24s %-10s %-12s %s\n", "probe", "confined", "no seccomp", "privileged")
	for _, p := range slices.Sorted(maps.Keys(wantProbes)) {
		fmt.Fprintf(&table, "%-24s %-10s %-12s %s\n", p, confined[p], noSeccomp[p], privileged[p])
	}
	t.Logf("probe outcomes:\n%s", table.String())

	lacks := hostLacks(t, attack)
	expected := forHost(wantProbes, lacks)
	// pid 1 of this container is the probe itself, which cannot attach
	// to itself either way; the query form of personality is allowed.
	same := map[string]bool{"ptrace-init": true, "personality-query": true}
	// What seccomp alone stops: these need no capability.
	seccompOnly := []string{"ptrace-child", "ptrace-daemon", "process_vm_readv", "unshare-user", "clone-newuser",
		"clone3", "keyctl", "add_key", "io_uring_setup", "personality", "tiocsti", "btrfs-subvol-create", "i386-abi", "x32-abi"}
	for _, p := range slices.Sorted(maps.Keys(wantProbes)) {
		t.Run(p, func(t *testing.T) {
			if got := confined[p]; !matches(expected[p], got) {
				t.Errorf("confined: got %q, want %s (as inside a corral sandbox)", got, expected[p])
			}
			if why, ok := lacks[p]; ok {
				t.Skipf("%s: confinement cannot be told from the host's own refusal", why)
			}
			if !same[p] && privileged[p] == confined[p] {
				t.Errorf("%q with and without confinement: the probe shows nothing", privileged[p])
			}
			if slices.Contains(seccompOnly, p) && noSeccomp[p] == confined[p] {
				t.Errorf("%q with and without seccomp, want a difference", confined[p])
			}
		})
	}
}
