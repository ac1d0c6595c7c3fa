package drivertest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
)

// hostMounts is a case's host side of a sandbox's mounts: directories
// under dir/host, and for each a source made as package mounts makes one,
// a clone of its mount moved to dir/src/<name>, read-only and recursive
// when asked. The clones are also noexec and noatime, as a directory on a
// file system mounted so would be: flags that a user namespace cannot
// clear and a sandbox must keep. dir is searchable by host root only, as
// the daemon's own directories are: the drivers reach sources the
// sandbox's root could not.
type hostMounts struct {
	dir     string
	sources []string
}

// newHostMounts makes the directory of a case's host mounts, removed
// when the case ends. It skips the case for a driver that binds no host
// directories.
func (s *suite) newHostMounts(t *testing.T) *hostMounts {
	t.Helper()
	if !s.h.Features.Mounts {
		t.Skip("the driver binds no host directories (Features.Mounts)")
	}
	dir, err := os.MkdirTemp("", "corral-mounts-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &hostMounts{dir: dir}
}

// add makes host directory name, writable by everyone (the sandbox's
// root need not be host root), and its source; it returns both paths.
func (h *hostMounts) add(t *testing.T, name string, readOnly bool) (host, src string) {
	t.Helper()
	host, src = filepath.Join(h.dir, "host", name), filepath.Join(h.dir, "src", name)
	for _, d := range []string{host, src} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(host, 0o777); err != nil {
		t.Fatal(err)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, host, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		t.Fatalf("cloning the mount of %s: %v", host, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC | unix.MOUNT_ATTR_NOATIME,
		Attr_clr: unix.MOUNT_ATTR__ATIME,
	}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		t.Fatalf("setting the attributes of %s's clone: %v", host, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, src, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatalf("mounting the clone of %s: %v", host, err)
	}
	t.Cleanup(func() { unix.Unmount(src, unix.MNT_DETACH) })
	h.sources = append(h.sources, src)
	return host, src
}

// wantOnlySources fails unless the sources are the only mounts under the
// case's directory: a sandbox's mounts must add none on the host.
func (h *hostMounts) wantOnlySources(t *testing.T) {
	t.Helper()
	got := testutil.Mounts(t, h.dir)
	slices.Sort(got)
	want := slices.Sorted(slices.Values(h.sources))
	if !slices.Equal(got, want) {
		t.Errorf("mounts under %s = %v, want only the sources %v", h.dir, got, want)
	}
}

func writeHostFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantFile fails unless the host file p holds want.
func wantFile(t *testing.T, p, want string) {
	t.Helper()
	if b, err := os.ReadFile(p); err != nil || string(b) != want {
		t.Errorf("host file %s = %q, %v; want %q", p, b, err, want)
	}
}

// deleteMounted deletes sandbox id and checks that nothing of it, its
// root rootfs or its mounts h stays mounted.
func (s *suite) deleteMounted(t *testing.T, id, rootfs string, h *hostMounts) {
	t.Helper()
	if err := s.d.Delete(t.Context(), id); err != nil {
		t.Fatalf("Delete(%s): %v", id, err)
	}
	s.wantNothingMounted(t, id, rootfs, h)
}

// wantNothingMounted checks that nothing of sandbox id, its root rootfs
// or its mounts h is mounted on the host, nor left by the driver.
func (s *suite) wantNothingMounted(t *testing.T, id, rootfs string, h *hostMounts) {
	t.Helper()
	if m := testutil.Mounts(t, rootfs); len(m) != 0 {
		t.Errorf("leak: mounts left under %s: %v", rootfs, m)
	}
	h.wantOnlySources(t)
	if s.h.NothingLeft != nil {
		s.h.NothingLeft(t, s.d, id, rootfs)
	}
}

// testMounts binds a read-only and a writable host directory and checks
// what the sandbox sees of them and of the host around them.
func testMounts(t *testing.T, s *suite) {
	ctx := t.Context()
	h := s.newHostMounts(t)
	ro, roSrc := h.add(t, "ro", true)
	rw, rwSrc := h.add(t, "rw", false)
	writeHostFile(t, filepath.Join(ro, "hello"), "from the host\n")
	writeHostFile(t, filepath.Join(ro, "run"), "#!/bin/sh\necho ran\n")
	if err := os.Chmod(filepath.Join(ro, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeHostFile(t, filepath.Join(filepath.Dir(ro), "secret"), "host only\n")
	id := s.newID("mounts")
	rootfs := s.rootfs(t)
	spec := driver.Spec{ID: id, RootFS: rootfs, Mounts: []driver.Mount{
		{Source: roSrc, Target: "/mnt/ro", ReadOnly: true},
		{Source: rwSrc, Target: "/work/rw"},
	}}
	if err := s.d.Create(ctx, spec); err != nil {
		t.Fatalf("Create(%s): %v", id, err)
	}
	a := s.agent(t, id)
	if b, err := a.readFile(ctx, "/mnt/ro/hello"); err != nil || string(b) != "from the host\n" {
		t.Errorf("reading /mnt/ro/hello = %q, %v; want the host file", b, err)
	}
	if res := s.sh(t, id, "echo no > /mnt/ro/new"); res.exitCode == 0 || !strings.Contains(res.stderr, "Read-only file system") {
		t.Errorf("write under /mnt/ro: exit %d, stderr %q; want EROFS", res.exitCode, res.stderr)
	}
	if err := a.writeFile(ctx, "/mnt/ro/new", []byte("no")); err == nil {
		t.Errorf("agent's file write under /mnt/ro succeeded")
	}
	if _, err := os.Stat(filepath.Join(ro, "new")); err == nil {
		t.Errorf("a write under /mnt/ro reached the host")
	}
	if res := s.sh(t, id, "/mnt/ro/run"); res.exitCode == 0 || strings.Contains(res.stdout, "ran") {
		t.Errorf("running a program from a noexec source: exit %d, stdout %q; want it refused", res.exitCode, res.stdout)
	}
	if res := s.sh(t, id, "echo from the sandbox > /work/rw/out"); res.exitCode != 0 {
		t.Errorf("write under /work/rw: exit %d, stderr %q", res.exitCode, res.stderr)
	}
	wantFile(t, filepath.Join(rw, "out"), "from the sandbox\n")
	writeHostFile(t, filepath.Join(rw, "late"), "after the start\n")
	if res := s.sh(t, id, "cat /work/rw/late && rm /work/rw/late"); res.stdout != "after the start\n" {
		t.Errorf("reading a file the host wrote after the start: stdout %q, stderr %q", res.stdout, res.stderr)
	}
	// The targets show the two directories and nothing around them: their
	// parents are the sandbox's, where the host's neighbour file is not.
	res := s.sh(t, id, "ls -A /mnt/ro; echo --; ls -A /work/rw; echo --; ls -A /mnt /work; cat /mnt/ro/../secret /work/rw/../secret")
	if want := "hello\nrun\n--\nout\n--\n"; !strings.HasPrefix(res.stdout, want) || strings.Contains(res.stdout, "host only") {
		t.Errorf("listing the targets gave %q; want it to start with %q and show no host file around them", res.stdout, want)
	}
	if ls := s.sh(t, id, "ls -A /work"); ls.stdout != "rw\n" {
		t.Errorf("ls /work = %q, want only the mount point rw", ls.stdout)
	}
	s.deleteMounted(t, id, rootfs, h)
	wantFile(t, filepath.Join(ro, "hello"), "from the host\n")
	wantFile(t, filepath.Join(rw, "out"), "from the sandbox\n")
}

// testMountOverSymlink gives a sandbox a root whose mount target is a
// symlink to a host directory: the mount must land inside the root (or
// Create fail), never on the host directory.
func testMountOverSymlink(t *testing.T, s *suite) {
	ctx := t.Context()
	h := s.newHostMounts(t)
	host, src := h.add(t, "src", false)
	decoy := filepath.Join(h.dir, "host", "decoy")
	if err := os.Mkdir(decoy, 0o777); err != nil {
		t.Fatal(err)
	}
	writeHostFile(t, filepath.Join(decoy, "marker"), "untouched\n")
	id := s.newID("mntlink")
	rootfs := s.rootfs(t)
	plantSymlink(t, rootfs, "work", decoy)
	spec := driver.Spec{ID: id, RootFS: rootfs, Mounts: []driver.Mount{{Source: src, Target: "/work/link"}}}
	if err := s.d.Create(ctx, spec); err != nil {
		t.Logf("Create refused the symlinked target: %v", err)
	} else {
		if m := testutil.Mounts(t, decoy); len(m) != 0 {
			t.Errorf("the host directory the symlink names is mounted over: %v", m)
		}
		res := s.sh(t, id, "echo via the link > /work/link/out; cat /work/link/marker")
		if strings.Contains(res.stdout, "untouched") {
			t.Errorf("the sandbox reads the host directory the symlink names: %q", res.stdout)
		}
		wantFile(t, filepath.Join(host, "out"), "via the link\n")
		// The runtime resolved the symlink as if the root were "/".
		if fi, err := os.Lstat(filepath.Join(rootfs, decoy)); err != nil || !fi.IsDir() {
			t.Errorf("no mount point at the symlink's target inside the root: %v", err)
		}
		s.deleteMounted(t, id, rootfs, h)
	}
	entries, err := os.ReadDir(decoy)
	if err != nil || len(entries) != 1 || entries[0].Name() != "marker" {
		t.Errorf("host directory the symlink names holds %v, %v; want only its marker", entries, err)
	}
	wantFile(t, filepath.Join(decoy, "marker"), "untouched\n")
	s.wantNothingMounted(t, id, rootfs, h)
}

// plantSymlink makes rootfs/dir/link a symlink to target, owned as the
// root directory is (a root with shifted owners keeps them).
func plantSymlink(t *testing.T, rootfs, dir, target string) {
	t.Helper()
	fi, err := os.Stat(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	d := filepath.Join(rootfs, dir)
	link := filepath.Join(d, "link")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{d, link} {
		if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}
