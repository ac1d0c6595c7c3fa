package rootfs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/rootfs"
	"github.com/corralrun/corral/internal/testutil"
)

// writeTree creates files (name -> content) under dir; a content starting
// with "-> " makes a symlink instead.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "-> "); ok {
			err = os.Symlink(target, p)
		} else {
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestFinishDebian runs the steps after debootstrap and apt on a fake tree
// shaped like a fresh debootstrap: the host's hostname and a resolv.conf
// symlink that points at the host, apt lists, skeleton files.
func TestFinishDebian(t *testing.T) {
	testutil.RequiresRoot(t) // the home directory is chowned to uid 1000
	root, outside, before := testutil.SandboxDirs(t)
	writeTree(t, root, map[string]string{
		"etc/passwd":                     "root:x:0:0:root:/root:/bin/bash", // no final newline
		"etc/group":                      "root:x:0:\n",
		"etc/shadow":                     "root:*:19000:0:99999:7:::\n",
		"etc/hostname":                   "vm\n",
		"etc/resolv.conf":                "-> " + filepath.Join(outside, "file"),
		"etc/skel/.bashrc":               "# bashrc\n",
		"etc/skel/.config/app.conf":      "x=1\n",
		"var/lib/apt/lists/lock":         "",
		"var/lib/apt/lists/partial/x":    "",
		"var/lib/apt/lists/deb_Packages": "Package: bash\n",
	})
	for range 2 { // idempotent
		if err := rootfs.FinishDebian(root); err != nil {
			t.Fatalf("finishing: %v", err)
		}
	}

	want := map[string]string{
		"etc/passwd":                 "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
		"etc/group":                  "root:x:0:\nuser:x:1000:\n",
		"etc/shadow":                 "root:*:19000:0:99999:7:::\nuser:!::0:99999:7:::\n",
		"etc/hostname":               "sandbox\n",
		"etc/resolv.conf":            "",
		"home/user/.bashrc":          "# bashrc\n",
		"home/user/.config/app.conf": "x=1\n",
	}
	for name, content := range want {
		if got := readFile(t, filepath.Join(root, name)); got != content {
			t.Errorf("%s = %q, want %q", name, got, content)
		}
	}
	if hosts := readFile(t, filepath.Join(root, "etc/hosts")); !strings.HasPrefix(hosts, "127.0.0.1\tlocalhost\n") {
		t.Errorf("etc/hosts = %q", hosts)
	}
	if fi := lstat(t, filepath.Join(root, "etc/resolv.conf")); !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("etc/resolv.conf mode = %v, want a plain 0644 file", fi.Mode())
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/gshadow")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("etc/gshadow was created in a tree that had none (err %v)", err)
	}
	entries, err := os.ReadDir(filepath.Join(root, "var/lib/apt/lists"))
	if err != nil || len(entries) != 0 {
		t.Errorf("var/lib/apt/lists: %d entries, err %v; want empty", len(entries), err)
	}
	for _, p := range []string{"home/user", "home/user/.bashrc", "home/user/.config", "home/user/.config/app.conf"} {
		st := lstat(t, filepath.Join(root, p)).Sys().(*syscall.Stat_t)
		if st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s owned by %d:%d, want 1000:1000", p, st.Uid, st.Gid)
		}
	}
	if diff := cmp.Diff(before, testutil.SnapshotOutside(t, filepath.Dir(root))); diff != "" {
		t.Errorf("files outside the tree changed (-before +after):\n%s", diff)
	}
}

// fakeDebootstrap writes a script standing in for debootstrap.
func fakeDebootstrap(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "debootstrap")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuildDebianPreconditions(t *testing.T) {
	full := t.TempDir()
	writeTree(t, full, map[string]string{"leftover": "x"})
	tests := []struct {
		name string
		dir  string
		opts rootfs.DebianOptions
	}{
		{"no debootstrap", t.TempDir(), rootfs.DebianOptions{Debootstrap: "/nonexistent/debootstrap"}},
		{"dir not empty", full, rootfs.DebianOptions{Debootstrap: fakeDebootstrap(t, "exit 0\n")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := rootfs.BuildDebian(t.Context(), tc.dir, tc.opts, nil)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("BuildDebian error = %v, want failed precondition", err)
			}
		})
	}
}

func TestBuildDebianStepFails(t *testing.T) {
	testutil.RequiresRoot(t) // unshare --mount
	testutil.RequiresBinary(t, "unshare")
	var progress bytes.Buffer
	opts := rootfs.DebianOptions{Debootstrap: fakeDebootstrap(t, "echo \"fake debootstrap $*\"\nexit 3\n")}
	err := rootfs.BuildDebian(t.Context(), t.TempDir(), opts, &progress)
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
		t.Fatalf("BuildDebian error = %v, want exit status 3", err)
	}
	if !strings.Contains(progress.String(), "fake debootstrap --variant=minbase bookworm ") {
		t.Errorf("progress = %q, want the step's output and arguments", progress.String())
	}
}

// TestBuildDebianCanceled checks that canceling kills the step's whole
// process group, including children it started, and returns promptly.
func TestBuildDebianCanceled(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "unshare")
	pids := filepath.Join(t.TempDir(), "pids")
	opts := rootfs.DebianOptions{Debootstrap: fakeDebootstrap(t,
		"sleep 600 &\necho $$ $! > "+pids+".tmp\nmv "+pids+".tmp "+pids+"\nwait\n")}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- rootfs.BuildDebian(ctx, t.TempDir(), opts, nil) }()
	var data []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if data, err = os.ReadFile(pids); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("fake debootstrap did not start: %v", <-done)
		}
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("BuildDebian error = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("BuildDebian did not return within 10s of cancel")
	}
	t.Logf("returned %v after cancel", time.Since(start))
	for _, f := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(f)
		if alive(pid) {
			t.Errorf("process %d of the canceled step is still running", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// alive reports whether pid runs (a zombie waiting for its reaper does not).
func alive(pid int) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return false
		}
	}
	return true
}

// TestBuildDebian builds the real default template: debootstrap plus apt
// from the Debian mirror, minutes and hundreds of megabytes. It runs only with
// CORRAL_TEST_DEBOOTSTRAP=1 and never under -short:
//
//	CORRAL_TEST_DEBOOTSTRAP=1 go test -run TestBuildDebian$ -timeout 30m ./internal/rootfs/
func TestBuildDebian(t *testing.T) {
	if testing.Short() || os.Getenv("CORRAL_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("builds a real Debian tree from the network; set CORRAL_TEST_DEBOOTSTRAP=1 to run")
	}
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "unshare")
	testutil.RequiresBinary(t, "chroot")
	dir := filepath.Join(t.TempDir(), "rootfs")
	var progress bytes.Buffer
	start := time.Now()
	err := rootfs.BuildDebian(t.Context(), dir, rootfs.DebianOptions{}, &progress)
	t.Logf("BuildDebian took %v", time.Since(start))
	if err != nil {
		out := progress.String()
		t.Fatalf("BuildDebian: %v\nlast output:\n%s", err, out[max(0, len(out)-4000):])
	}
	if m := testutil.Mounts(t, dir); len(m) > 0 {
		t.Errorf("mounts left under the tree: %v", m)
	}
	if du, err := exec.Command("du", "-sh", dir).Output(); err == nil {
		t.Logf("size: %s", du)
	}

	script := `set -e
python3 -c 'print(6*7)'
node -e 'console.log(6*7)'
npm --version >/dev/null
git --version >/dev/null
curl --version >/dev/null
python3 -m venv /tmp/venv && /tmp/venv/bin/pip --version >/dev/null
command -v ps less >/dev/null
test -f /etc/ssl/certs/ca-certificates.crt
id user
su user -s /bin/bash -c 'cd && pwd'
`
	out, err := exec.Command("chroot", dir, "/bin/bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("checking the tree: %v\n%s", err, out)
	}
	want := "42\n42\nuid=1000(user) gid=1000(user) groups=1000(user)\n/home/user\n"
	if string(out) != want {
		t.Errorf("checks printed %q, want %q", out, want)
	}
	if fi := lstat(t, filepath.Join(dir, "etc/resolv.conf")); !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Errorf("etc/resolv.conf: mode %v size %d, want an empty regular file", fi.Mode(), fi.Size())
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "var/lib/apt/lists")); len(entries) != 0 {
		t.Errorf("var/lib/apt/lists has %d entries, want none", len(entries))
	}
	if debs, _ := filepath.Glob(filepath.Join(dir, "var/cache/apt/archives/*.deb")); len(debs) != 0 {
		t.Errorf("apt cache holds %d .deb files, want none", len(debs))
	}
	for _, p := range []string{"usr/sbin/policy-rc.d", "debootstrap"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err == nil {
			t.Errorf("build leftover %s is in the tree", p)
		}
	}
}
