package hostile

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// testNeighbourFiles checks that each sandbox runs under host IDs of its
// own and that code running as one sandbox's root host user (what a
// kernel escape would give it) cannot read another sandbox's 0600 file,
// neither through the other's mounts (/proc/<pid>/root) nor where it is
// stored (the upper layer), while the other's own host user reads it
// through its mounts.
func testNeighbourFiles(t *testing.T, s *suite) {
	a, b := s.create(t, corral.CreateOptions{}), s.create(t, corral.CreateOptions{})
	s.sh(t, b, "echo neighbour-secret > /root/secret; chmod 600 /root/secret", 10*time.Second)
	// Read host-side: inside gVisor, /proc/self/uid_map is the Sentry's
	// own view, not the host's.
	mapA, mapB := readFile(t, "/proc/"+firstPid(t, s.cgroupProcs(a))+"/uid_map"), readFile(t, "/proc/"+firstPid(t, s.cgroupProcs(b))+"/uid_map")
	t.Logf("uid_map of A: %s; of B: %s", strings.TrimSpace(mapA), strings.TrimSpace(mapB))
	uidA, uidB := hostRoot(t, mapA), hostRoot(t, mapB)
	if uidA == uidB {
		t.Fatalf("both sandboxes run as host user %d", uidA)
	}
	mounts := rootMounts(t, s, b)
	if out, err := readAsHostUser(t, uidB, mounts, "secret"); err != nil || out != "neighbour-secret\n" {
		t.Errorf("B's host user reads its file through its mounts: %q, %v", out, err)
	}
	if out, err := readAsHostUser(t, uidA, mounts, "secret"); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("A's host user reads B's file through B's mounts: %q, %v", out, err)
	}
	upper := storedUpper(t, s, b)
	for _, uid := range []uint32{uidA, uidB} {
		if out, err := readAsHostUser(t, uid, filepath.Join(upper, "root"), "secret"); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("host user %d reads B's stored file: %q, %v", uid, out, err)
		}
	}
}

// hostRoot returns the host ID that uid_map maps 0 to.
func hostRoot(t *testing.T, uidMap string) uint32 {
	t.Helper()
	f := strings.Fields(uidMap)
	if len(f) != 3 || f[0] != "0" {
		t.Fatalf("unexpected uid_map %q", uidMap)
	}
	n, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(n)
}

func firstPid(t *testing.T, procs string) string {
	t.Helper()
	b, err := os.ReadFile(procs)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		t.Fatalf("no process in %s", procs)
	}
	return f[0]
}

// storedUpper finds sandbox id's upper layer under the daemon's storage.
func storedUpper(t *testing.T, s *suite, id string) string {
	t.Helper()
	for _, p := range []string{"roots", "*/roots", "*/*/roots"} {
		m, _ := filepath.Glob(filepath.Join(s.d.StateDir, "storage", p, id, "upper"))
		if len(m) == 1 {
			return m[0]
		}
	}
	t.Fatalf("no upper layer of %s under %s", id, s.d.StateDir)
	return ""
}

// readAsHostUser runs cat on dir/name in a child process that this test
// starts as host user and group uid, with dir opened beforehand by the
// test (host root), so that only the file's own permissions decide. It
// returns cat's output (stderr on failure).
func readAsHostUser(t *testing.T, uid uint32, dir, name string) (string, error) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cmd := exec.Command("cat", "/proc/self/fd/3/"+name)
	cmd.ExtraFiles = []*os.File{d}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// rootMounts returns the host path of sandbox id's /root through its
// mounts: through /proc/<pid>/root of the first of its host processes
// that shows the root (under gVisor the Sentry's root is empty, the
// gofer's is the sandbox's).
func rootMounts(t *testing.T, s *suite, id string) string {
	t.Helper()
	b, err := os.ReadFile(s.cgroupProcs(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range strings.Fields(string(b)) {
		p := filepath.Join("/proc", pid, "root", "root")
		if _, err := os.Stat(filepath.Join(p, "secret")); err == nil {
			return p
		}
	}
	t.Fatalf("no process of %s shows its root", id)
	return ""
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
