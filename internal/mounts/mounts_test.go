package mounts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/testutil"
)

// sandboxRoot stands for the host IDs of a sandbox's root user in a user
// namespace (the runc driver's range starts there).
var sandboxRoot = driver.HostIDs{UID: 1 << 31, GID: 1 << 31}

type env struct {
	m                   *Mounter
	allowed, run, state string
	outside             string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	testutil.RequiresRoot(t)
	base := t.TempDir()
	e := &env{
		allowed: filepath.Join(base, "allowed"),
		run:     filepath.Join(base, "run"),
		state:   filepath.Join(base, "state"),
		outside: filepath.Join(base, "outside"),
	}
	for _, d := range []string{e.allowed, e.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m, err := New(Config{Allowed: []string{e.allowed}, RunDir: e.run, StateDir: e.state})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	t.Cleanup(func() {
		if left := testutil.Mounts(t, e.run); len(left) > 0 {
			t.Errorf("mounts left: %v", left)
			for _, p := range left {
				unix.Unmount(p, unix.MNT_DETACH)
			}
		}
		m.Close()
	})
	return e
}

// dir makes a directory under the allowed root, owned by uid:gid, with
// one file in it.
func (e *env) dir(t testing.TB, name string, uid, gid int) string {
	t.Helper()
	d := filepath.Join(e.allowed, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(d, "hello")
	if err := os.WriteFile(f, []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{d, f} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestCheckRefuses(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 0, 0)
	if err := os.Symlink(e.outside, filepath.Join(e.allowed, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.outside, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, source string
		kind         error
		says         string
	}{
		{"outside the roots", e.outside, errdefs.ErrPermissionDenied, e.allowed},
		{"a symlink", filepath.Join(e.allowed, "link"), errdefs.ErrInvalidArgument, "symlink"},
		{"a symlinked parent", filepath.Join(e.allowed, "link", "sub"), errdefs.ErrInvalidArgument, "symlink"},
		{"dot-dot", e.allowed + "/repo/../../outside", errdefs.ErrInvalidArgument, "clean"},
		{"a file", filepath.Join(repo, "hello"), errdefs.ErrInvalidArgument, "not a directory"},
		{"missing", filepath.Join(e.allowed, "nope"), errdefs.ErrInvalidArgument, "no such"},
		{"relative", "repo", errdefs.ErrInvalidArgument, "absolute"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := e.m.Check([]sandbox.Mount{{Source: tt.source, Target: "/w", Mode: sandbox.MountReadOnly}})
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("Check(%s) = %v, want %v saying %q", tt.source, err, tt.kind, tt.says)
			}
		})
	}
	if err := e.m.Check([]sandbox.Mount{{Source: repo, Target: "/w"}, {Source: e.allowed, Target: "/a"}}); err != nil {
		t.Fatalf("Check of allowed sources: %v", err)
	}

	none, err := New(Config{RunDir: e.run, StateDir: e.state})
	if err != nil {
		t.Fatal(err)
	}
	if err := none.Check([]sandbox.Mount{{Source: repo, Target: "/w"}}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("Check without allowed roots = %v, want permission_denied", err)
	}
}

func TestReadOnly(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	dm := e.prepare(t, "ro1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadOnly})
	if !dm[0].ReadOnly || dm[0].Target != "/w" {
		t.Fatalf("driver mount = %+v", dm[0])
	}
	if b, err := os.ReadFile(filepath.Join(dm[0].Source, "hello")); err != nil || string(b) != "hi\n" {
		t.Fatalf("read through the mount: %q, %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dm[0].Source, "hello"), &st); err != nil || st.Uid != sandboxRoot.UID {
		t.Fatalf("the owner's file shows as uid %d through a ro mount (%v), want the sandbox root %d", st.Uid, err, sandboxRoot.UID)
	}
	err := os.WriteFile(filepath.Join(dm[0].Source, "new"), nil, 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through a read-only mount: %v, want EROFS", err)
	}
	e.release(t, "ro1")
}

func TestReadOnlyIsRecursive(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 0, 0)
	inner := filepath.Join(repo, "inner")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", inner, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(inner, unix.MNT_DETACH) })
	dm := e.prepare(t, "ro2", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadOnly})
	err := os.WriteFile(filepath.Join(dm[0].Source, "inner", "x"), nil, 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write into a mount inside a read-only source: %v, want EROFS", err)
	}
	e.release(t, "ro2")
}

func TestReadWriteMapsTheOwner(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1001)
	dm := e.prepare(t, "rw1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadWrite})
	if dm[0].ReadOnly {
		t.Fatal("rw mount marked read-only")
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dm[0].Source, "hello"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != sandboxRoot.UID || st.Gid != sandboxRoot.GID {
		t.Fatalf("the owner's file shows as %d:%d through the mount, want the sandbox root %d:%d", st.Uid, st.Gid, sandboxRoot.UID, sandboxRoot.GID)
	}
	// A write by the sandbox's root user lands as the directory's owner.
	asSandboxRoot(t, dm[0].Source, `echo made > made`)
	if err := unix.Stat(filepath.Join(repo, "made"), &st); err != nil {
		t.Fatalf("the write did not reach the host directory: %v", err)
	}
	if st.Uid != 1000 || st.Gid != 1001 {
		t.Fatalf("the sandbox's file is %d:%d on the host, want the owner's 1000:1001", st.Uid, st.Gid)
	}
	e.release(t, "rw1")
	if _, err := os.Stat(filepath.Join(repo, "made")); err != nil {
		t.Fatalf("release removed what the sandbox wrote: %v", err)
	}
}

func TestCopyOnWriteLeavesTheHostAlone(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	dm := e.prepare(t, "cow1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountCopyOnWrite})
	src := dm[0].Source
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(src, "hello"), &st); err != nil || st.Uid != sandboxRoot.UID {
		t.Fatalf("the owner's file through a cow mount: uid %d, %v; want %d", st.Uid, err, sandboxRoot.UID)
	}
	if err := os.WriteFile(filepath.Join(repo, "gone"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(repo, "gone"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	asSandboxRoot(t, src, `echo changed > hello && echo new > new && rm gone && mkdir sub && echo f > sub/f`)
	if b, _ := os.ReadFile(filepath.Join(src, "hello")); string(b) != "changed\n" {
		t.Fatalf("the sandbox reads %q back, want its change", b)
	}
	if b, _ := os.ReadFile(filepath.Join(repo, "hello")); string(b) != "hi\n" {
		t.Fatalf("the host file became %q", b)
	}
	for _, name := range []string{"new", "sub"} {
		if _, err := os.Stat(filepath.Join(repo, name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s, which the sandbox made, appeared on the host: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(repo, "gone")); err != nil {
		t.Fatalf("the sandbox's deletion reached the host: %v", err)
	}
	changes, err := e.m.Changes("cow1", 0, "/w")
	if err != nil {
		t.Fatal(err)
	}
	want := []sandbox.Change{
		{Path: "/w/gone", Kind: sandbox.ChangeDeleted},
		{Path: "/w/hello", Kind: sandbox.ChangeModified},
		{Path: "/w/new", Kind: sandbox.ChangeAdded},
		{Path: "/w/sub", Kind: sandbox.ChangeAdded},
		{Path: "/w/sub/f", Kind: sandbox.ChangeAdded},
	}
	if fmt.Sprint(changes) != fmt.Sprint(want) {
		t.Fatalf("Changes = %v, want %v", changes, want)
	}
	e.release(t, "cow1")
	if _, err := os.Stat(filepath.Join(e.state, "cow1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the copy-on-write layer is left: %v", err)
	}
}

func TestFailedPrepareLeavesNothing(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 0, 0)
	_, err := e.m.Prepare(context.Background(), "bad1", []sandbox.Mount{
		{Source: repo, Target: "/a", Mode: sandbox.MountReadOnly},
		{Source: repo, Target: "/b", Mode: sandbox.MountCopyOnWrite},
		{Source: filepath.Join(repo, "hello"), Target: "/c", Mode: sandbox.MountReadOnly},
	}, sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Prepare with a file source = %v, want invalid_argument", err)
	}
	e.checkGone(t, "bad1")
}

func TestSweepRemovesOrphans(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 0, 0)
	e.prepare(t, "keep1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountCopyOnWrite})
	e.prepare(t, "gone1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountCopyOnWrite})
	if err := e.m.Sweep(context.Background(), func(id string) bool { return id == "keep1" }); err != nil {
		t.Fatal(err)
	}
	e.checkGone(t, "gone1")
	if len(testutil.Mounts(t, filepath.Join(e.run, "keep1"))) == 0 {
		t.Fatal("Sweep removed the mounts of a sandbox it was told to keep")
	}
	e.release(t, "keep1")
}

// asSandboxRoot runs script in dir as the sandbox's root user, which
// cannot search the daemon's private directories above dir: it enters
// dir through a descriptor opened here.
func asSandboxRoot(t *testing.T, dir, script string) {
	t.Helper()
	runAs(t, sandboxRoot, dir, script)
}

// runAs runs script in dir as the host IDs ids, with no capability.
func runAs(t *testing.T, ids driver.HostIDs, dir, script string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cmd := exec.Command("sh", "-c", "cd /proc/self/fd/3 && "+script)
	cmd.ExtraFiles = []*os.File{d}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: ids.UID, Gid: ids.GID}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s as %d:%d: %v %s", script, ids.UID, ids.GID, err, out)
	}
}

func (e *env) prepare(t *testing.T, id string, ms ...sandbox.Mount) []driver.Mount {
	t.Helper()
	dm, err := e.m.Prepare(context.Background(), id, ms, sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if len(dm) != len(ms) {
		t.Fatalf("Prepare returned %d mounts for %d", len(dm), len(ms))
	}
	return dm
}

func (e *env) release(t *testing.T, id string) {
	t.Helper()
	if err := e.m.Release(context.Background(), id); err != nil {
		t.Fatalf("Release: %v", err)
	}
	e.checkGone(t, id)
	if err := e.m.Release(context.Background(), id); err != nil {
		t.Fatalf("a second Release: %v", err)
	}
}

func (e *env) checkGone(t *testing.T, id string) {
	t.Helper()
	if left := testutil.Mounts(t, filepath.Join(e.run, id)); len(left) > 0 {
		t.Fatalf("mounts left of %s: %v", id, left)
	}
	for _, d := range []string{filepath.Join(e.run, id), filepath.Join(e.state, id)} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s is left: %v", d, err)
		}
	}
}

func TestReadWriteRefusesRootOwned(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 0, 0)
	for _, mode := range []sandbox.MountMode{sandbox.MountReadWrite} {
		err := e.m.Check([]sandbox.Mount{{Source: repo, Target: "/w", Mode: mode}})
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "owned by root") {
			t.Fatalf("Check of a root-owned rw source = %v, want failed_precondition", err)
		}
		_, err = e.m.Prepare(context.Background(), "root1", []sandbox.Mount{{Source: repo, Target: "/w", Mode: mode}}, sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot})
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("Prepare of a root-owned rw source = %v, want failed_precondition", err)
		}
		e.checkGone(t, "root1")
	}
	e.prepare(t, "root2", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadOnly},
		sandbox.Mount{Source: repo, Target: "/v", Mode: sandbox.MountCopyOnWrite})
	e.release(t, "root2")
}

// Release finds what it made even when the run directory was named
// through a symlink, and never deletes through a mount it could not
// detach: the host directory's files survive.
func TestReleaseThroughSymlinkedRunDir(t *testing.T) {
	testutil.RequiresRoot(t)
	base := t.TempDir()
	allowed, real := filepath.Join(base, "allowed"), filepath.Join(base, "real-run")
	for _, d := range []string{allowed, real} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(base, "run")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Allowed: []string{allowed}, RunDir: link, StateDir: filepath.Join(base, "state")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e := &env{m: m, allowed: allowed, run: real, state: filepath.Join(base, "state")}
	repo := e.dir(t, "repo", 1000, 1000)
	e.prepare(t, "sym1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadWrite})
	e.release(t, "sym1")
	if _, err := os.Stat(filepath.Join(repo, "hello")); err != nil {
		t.Fatalf("the host directory's file is gone after Release: %v", err)
	}
}

// A mount the host makes beneath a source after it was prepared does not
// appear in the clone.
func TestLateHostMountStaysOut(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	sub := filepath.Join(repo, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// The source is a shared mount, as / is on systemd hosts, so that
	// what is mounted beneath it propagates to its peers.
	if err := unix.Mount(repo, repo, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(repo, unix.MNT_DETACH)
	if err := unix.Mount("", repo, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	dm := e.prepare(t, "late1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadOnly})
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(sub, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(sub, "late"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dm[0].Source, "sub", "late")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a host mount made after Prepare shows in the clone: %v", err)
	}
	e.release(t, "late1")
}
