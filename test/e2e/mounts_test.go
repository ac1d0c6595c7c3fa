package e2e

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// hostOwner is the owner of the host directory a rw mount writes to: the
// files a sandbox creates there must be its, whatever the sandbox's user
// namespace maps root to.
const hostOwner = 1000

// TestMounts mounts host directories beneath the one the daemon allows,
// through the SDK and through `corral run -v`, in each mode: ro reads and
// refuses writes, rw writes reach the host owned by the directory's owner,
// cow writes stay in the sandbox. Sources outside the allowed directory or
// under a symlink are refused, and a deleted sandbox leaves no mount.
func TestMounts(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testutil.RequiresBinary(t, "runsc")
	d := startDaemon(t, e2eStorage, "--allow-mount", allowed, "--runtimes", "gvisor")
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) { testMountModes(t, d, mountRoot(t, allowed, rt), rt) })
	}
	testMountsCLI(t, d, mountRoot(t, allowed, "cli"))
}

// testMountModes checks each mode on runtime rt with mounts of root's
// directories.
func testMountModes(t *testing.T, d *daemon, root, rt string) {
	ctx := t.Context()
	sb := d.create(t, corral.CreateOptions{Runtime: rt, Mounts: []corral.Mount{
		{Source: filepath.Join(root, "ro"), Target: "/data", Mode: corral.MountReadOnly},
		{Source: filepath.Join(root, "rw"), Target: "/rw"},
		{Source: filepath.Join(root, "cow"), Target: "/cow", Mode: corral.MountCopyOnWrite},
	}})
	want := []corral.Mount{
		{Source: filepath.Join(root, "ro"), Target: "/data", Mode: "ro"},
		{Source: filepath.Join(root, "rw"), Target: "/rw", Mode: "rw"},
		{Source: filepath.Join(root, "cow"), Target: "/cow", Mode: "cow"},
	}
	if diff := cmp.Diff(want, sb.Mounts); diff != "" {
		t.Fatalf("sandbox's mounts (-want +got):\n%s", diff)
	}
	if out, _, code := d.corral("inspect", sb.ID); code != 0 || !strings.Contains(out, `"mounts"`) || !strings.Contains(out, `"cow"`) {
		t.Errorf("corral inspect: exit %d, %s; want the mounts", code, out)
	}

	if out, res := d.execOut(t, sb.ID, "cat /data/hello"); res.ExitCode != 0 || out != "hello ro\n" {
		t.Errorf("reading the ro mount: exit %d, %q", res.ExitCode, out)
	}
	if out, res := d.execOut(t, sb.ID, "echo x > /data/new"); res.ExitCode == 0 {
		t.Errorf("writing to the ro mount succeeded: %q", out)
	}
	if _, err := os.Stat(filepath.Join(root, "ro", "new")); !os.IsNotExist(err) {
		t.Errorf("a write to the ro mount reached the host: %v", err)
	}

	if out, res := d.execOut(t, sb.ID, "echo from sandbox > /rw/new && mkdir /rw/sub"); res.ExitCode != 0 {
		t.Errorf("writing to the rw mount: exit %d, %q", res.ExitCode, out)
	}
	checkHostFile(t, filepath.Join(root, "rw", "new"), "from sandbox\n")
	checkOwner(t, filepath.Join(root, "rw", "new"))
	checkOwner(t, filepath.Join(root, "rw", "sub"))

	if out, res := d.execOut(t, sb.ID, "echo changed > /cow/hello && echo new > /cow/new && cat /cow/hello /cow/new"); res.ExitCode != 0 || out != "changed\nnew\n" {
		t.Errorf("writing to the cow mount: exit %d, %q", res.ExitCode, out)
	}
	checkHostFile(t, filepath.Join(root, "cow", "hello"), "hello cow\n")
	if _, err := os.Stat(filepath.Join(root, "cow", "new")); !os.IsNotExist(err) {
		t.Errorf("a write to the cow mount reached the host: %v", err)
	}

	changes, err := d.Client.MountChanges(ctx, sb.ID, "/cow")
	wantChanges := []corral.Change{{Path: "/cow/hello", Kind: corral.ChangeModified}, {Path: "/cow/new", Kind: corral.ChangeAdded}}
	if err != nil || !cmp.Equal(changes, wantChanges) {
		t.Errorf("MountChanges(/cow) = %v, %v; want %v", changes, err, wantChanges)
	}
	if out, _, code := d.corral("diff", sb.ID, "/cow"); code != 0 || out != "M /cow/hello\nA /cow/new\n" {
		t.Errorf("corral diff: exit %d, %q", code, out)
	}
	if _, err := d.Client.MountChanges(ctx, sb.ID, "/rw"); corral.ErrorCode(err) != corral.CodeFailedPrecondition {
		t.Errorf("MountChanges of a rw mount: %v; want %s", err, corral.CodeFailedPrecondition)
	}
	if err := d.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkUnmounted(t, root, sb.ID)
}

// testMountsCLI checks `corral run -v`, with a source relative to the
// CLI's working directory, and the refusals.
func testMountsCLI(t *testing.T, d *daemon, root string) {
	ctx := t.Context()
	t.Chdir(root)
	stdout, stderr, code := d.corral("run", "--template", "bb", "-v", "./ro:/data:ro", "-v", filepath.Join(root, "rw")+":/rw",
		"--", "sh", "-c", "cat /data/hello && echo from cli > /rw/cli && ! touch /data/cli 2>/dev/null")
	if code != 0 || stdout != "hello ro\n" {
		t.Errorf("corral run -v: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	checkHostFile(t, filepath.Join(root, "rw", "cli"), "from cli\n")
	checkOwner(t, filepath.Join(root, "rw", "cli"))
	if _, stderr, code := d.corral("run", "--template", "bb", "-v", "./ro:/data:rx", "--", "true"); code != 2 || !strings.Contains(stderr, `mode "rx"`) {
		t.Errorf("corral run -v with a bad mode: exit %d, stderr %q; want 2 naming the mode", code, stderr)
	}

	outside := t.TempDir()
	if _, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", Mounts: []corral.Mount{{Source: outside, Target: "/x"}}}); corral.ErrorCode(err) != corral.CodePermissionDenied {
		t.Errorf("a source outside the allowed directory: %v; want %s", err, corral.CodePermissionDenied)
	}
	linked := filepath.Join(root, "link", "dir")
	if _, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", Mounts: []corral.Mount{{Source: linked, Target: "/x"}}}); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Errorf("a source with a symlinked parent: %v; want %s", err, corral.CodeInvalidArgument)
	}
	if list, err := d.Client.List(ctx, corral.ListOptions{}); err != nil || len(list) != 0 {
		t.Errorf("sandboxes left: %v %v", list, err)
	}
	checkUnmounted(t, root, "")
}

// mountRoot makes allowed/name, beneath the directory the daemon allows: ro and cow, each with a
// file "hello", rw owned by hostOwner, and link, a symlink to real, which
// holds dir.
func mountRoot(t *testing.T, allowed, name string) string {
	t.Helper()
	root := filepath.Join(allowed, name)
	for _, dir := range []string{"ro", "rw", "cow", "real/dir"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"ro", "cow"} {
		if err := os.WriteFile(filepath.Join(root, name, "hello"), []byte("hello "+name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(root, "rw"), hostOwner, hostOwner); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	// The daemon runs as root; the sandbox's users reach the directory
	// only through its mounts.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func checkHostFile(t *testing.T, name, want string) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil || string(b) != want {
		t.Errorf("host file %s: %q, %v; want %q", name, b, err, want)
	}
}

// checkOwner fails t unless name belongs to hostOwner on the host.
func checkOwner(t *testing.T, name string) {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Errorf("stat %s: %v", name, err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != hostOwner || st.Gid != hostOwner {
		t.Errorf("%s belongs to %d:%d on the host, want the directory's owner %d:%d", name, st.Uid, st.Gid, hostOwner, hostOwner)
	}
}

// checkUnmounted fails t for every line of /proc/self/mountinfo that names
// root, as a mount point or as the root of a bind mount (which mountinfo
// gives relative to its file system: only root's last two names are
// sought), or, when id is not empty, the sandbox id.
func checkUnmounted(t *testing.T, root, id string) {
	t.Helper()
	// A delete tears the sandbox's network down in the background, after
	// it has answered: its namespace's mount may outlive the answer by a
	// moment, but not by seconds.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left = mountedWith(t, root, id)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, line := range left {
		t.Errorf("left mounted: %s", line)
	}
}

// mountedWith returns the lines of this process's mount table that name
// root's last two path elements or, when not empty, id.
func mountedWith(t *testing.T, root, id string) []string {
	t.Helper()
	tail := filepath.Join(filepath.Base(filepath.Dir(root)), filepath.Base(root))
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var left []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, tail) || (id != "" && strings.Contains(line, id)) {
			left = append(left, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return left
}

// TestMountsThroughCrash SIGKILLs the daemon while creates with mounts are
// in flight, restarts it, and checks that every sandbox left still sees
// its mounts and that, once they are deleted, no mount is left: what the
// killed daemon prepared for creates it never finished is swept.
func TestMountsThroughCrash(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := mountRoot(t, allowed, "crash")
	d := startDaemon(t, e2eStorage, "--allow-mount", allowed)
	mounts := []corral.Mount{
		{Source: filepath.Join(root, "ro"), Target: "/data", Mode: corral.MountReadOnly},
		{Source: filepath.Join(root, "cow"), Target: "/cow", Mode: corral.MountCopyOnWrite},
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
		once sync.Once
	)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb", Mounts: mounts}); err != nil {
				return
			}
			mu.Lock()
			done++
			n := done
			mu.Unlock()
			if n == 2 {
				once.Do(d.Kill)
			}
		}()
	}
	wg.Wait()
	once.Do(d.Kill)
	d.Start()
	list, err := d.Client.List(t.Context(), corral.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of 6 sandboxes exist after the restart", len(list))
	for _, sb := range list {
		if out, res := d.execOut(t, sb.ID, "cat /data/hello /cow/hello"); res.ExitCode != 0 || out != "hello ro\nhello cow\n" {
			t.Errorf("sandbox %s after the restart reads %q (exit %d)", sb.ID, out, res.ExitCode)
		}
		if err := d.Client.Delete(t.Context(), sb.ID); err != nil {
			t.Errorf("deleting %s: %v", sb.ID, err)
		}
	}
	checkUnmounted(t, root, "")
	if ents, err := os.ReadDir(filepath.Join(d.RunDir, "mounts")); err == nil && len(ents) > 0 {
		t.Errorf("prepared mounts left in the run dir: %v", ents)
	}
}
