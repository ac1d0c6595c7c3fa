package agentserver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/wire"
)

// ignoreTimes compares FileInfo without modification times.
var ignoreTimes = cmpopts.IgnoreFields(wire.FileInfo{}, "ModTime")

func readAll(t *testing.T, c *agentclient.Client, p string) ([]byte, int64) {
	t.Helper()
	rc, size, err := c.ReadFile(t.Context(), p)
	if err != nil {
		t.Fatalf("ReadFile(%s): %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading %s: %v", p, err)
	}
	return b, size
}

func TestWriteReadFile(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	uid, gid := os.Getuid(), os.Getgid()

	big := make([]byte, 4<<20+17)
	rand.Read(big)
	tests := []struct {
		name    string
		path    string
		mode    os.FileMode
		content []byte
		want    wire.FileInfo
	}{
		{"small", "/hello.txt", 0o644, []byte("hello\n"),
			wire.FileInfo{Name: "hello.txt", Path: "/hello.txt", Type: "file", Size: 6, Mode: 0o644, UID: uid, GID: gid}},
		{"exact mode despite umask", "/secret", 0o777, []byte("x"),
			wire.FileInfo{Name: "secret", Path: "/secret", Type: "file", Size: 1, Mode: 0o777, UID: uid, GID: gid}},
		{"creates parents", "/a/b/c/deep.bin", 0o600, big,
			wire.FileInfo{Name: "deep.bin", Path: "/a/b/c/deep.bin", Type: "file", Size: int64(len(big)), Mode: 0o600, UID: uid, GID: gid}},
		{"path is cleaned", "/x/../y//z.txt", 0o644, []byte("z"),
			wire.FileInfo{Name: "z.txt", Path: "/y/z.txt", Type: "file", Size: 1, Mode: 0o644, UID: uid, GID: gid}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A reader that is not a bytes.Reader makes the client stream
			// without a known length.
			info, err := a.client.WriteFile(ctx, tt.path, tt.mode, io.MultiReader(bytes.NewReader(tt.content)))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, info, ignoreTimes); diff != "" {
				t.Errorf("WriteFile info (-want +got):\n%s", diff)
			}
			if time.Since(info.ModTime) > time.Minute {
				t.Errorf("mod time %v is not recent", info.ModTime)
			}
			got, size := readAll(t, a.client, tt.path)
			if !bytes.Equal(got, tt.content) || size != int64(len(tt.content)) {
				t.Errorf("read back %d bytes (size %d), want %d bytes", len(got), size, len(tt.content))
			}
			onHost, err := os.ReadFile(filepath.Join(a.root, filepath.Clean(tt.path)))
			if err != nil || !bytes.Equal(onHost, tt.content) {
				t.Errorf("file on host: %d bytes, %v", len(onHost), err)
			}
		})
	}

	t.Run("overwrite truncates", func(t *testing.T) {
		if _, err := a.client.WriteFile(ctx, "/hello.txt", 0o644, strings.NewReader("hi")); err != nil {
			t.Fatal(err)
		}
		if got, _ := readAll(t, a.client, "/hello.txt"); string(got) != "hi" {
			t.Fatalf("content = %q", got)
		}
	})
	t.Run("setuid mode", func(t *testing.T) {
		info, err := a.client.WriteFile(ctx, "/suid2", 0o755|os.ModeSetuid, strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode != 0o4755 {
			t.Fatalf("mode = %#o, want 04755", info.Mode)
		}
	})
	t.Run("parents get 0755", func(t *testing.T) {
		info, err := a.client.Stat(ctx, "/a/b")
		if err != nil {
			t.Fatal(err)
		}
		if info.Type != wire.FileTypeDir || info.Mode != 0o755&^uint32(umask()) {
			t.Fatalf("parent = %+v", info)
		}
	})
	t.Run("empty file", func(t *testing.T) {
		if _, err := a.client.WriteFile(ctx, "/empty", 0o644, nil); err != nil {
			t.Fatal(err)
		}
		got, size := readAll(t, a.client, "/empty")
		if len(got) != 0 || size > 0 {
			t.Fatalf("read %d bytes, size %d", len(got), size)
		}
	})
}

func umask() int {
	m := unix.Umask(0)
	unix.Umask(m)
	return m
}

func TestStatListMkdirRenameRemove(t *testing.T) {
	a := startAgent(t)
	ctx := t.Context()
	uid, gid := os.Getuid(), os.Getgid()
	mustWrite(t, a.client, "/dir/b.txt", "bb")
	mustWrite(t, a.client, "/dir/a.txt", "a")
	if err := os.Symlink("a.txt", filepath.Join(a.root, "dir", "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.Mkdir(ctx, wire.MkdirRequest{Path: "/dir/sub", Mode: 0o700}); err != nil {
		t.Fatal(err)
	}

	t.Run("stat symlink is not followed", func(t *testing.T) {
		got, err := a.client.Stat(ctx, "/dir/link")
		if err != nil {
			t.Fatal(err)
		}
		want := wire.FileInfo{Name: "link", Path: "/dir/link", Type: "symlink", Size: 5, Mode: 0o777, UID: uid, GID: gid, Target: "a.txt"}
		if diff := cmp.Diff(want, got, ignoreTimes); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
	})
	t.Run("stat root", func(t *testing.T) {
		got, err := a.client.Stat(ctx, "/")
		if err != nil {
			t.Fatal(err)
		}
		if got.Path != "/" || got.Name != "/" || got.Type != wire.FileTypeDir {
			t.Fatalf("stat / = %+v", got)
		}
	})
	t.Run("list sorted", func(t *testing.T) {
		got, err := a.client.List(ctx, "/dir")
		if err != nil {
			t.Fatal(err)
		}
		want := []wire.FileInfo{
			{Name: "a.txt", Path: "/dir/a.txt", Type: "file", Size: 1, Mode: 0o644, UID: uid, GID: gid},
			{Name: "b.txt", Path: "/dir/b.txt", Type: "file", Size: 2, Mode: 0o644, UID: uid, GID: gid},
			{Name: "link", Path: "/dir/link", Type: "symlink", Size: 5, Mode: 0o777, UID: uid, GID: gid, Target: "a.txt"},
			{Name: "sub", Path: "/dir/sub", Type: "dir", Mode: 0o700, UID: uid, GID: gid},
		}
		if diff := cmp.Diff(want, got, ignoreTimes, cmpopts.IgnoreFields(wire.FileInfo{}, "Size")); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
		for i := range 3 {
			if got[i].Size != want[i].Size {
				t.Errorf("%s size = %d, want %d", got[i].Path, got[i].Size, want[i].Size)
			}
		}
	})
	t.Run("list empty dir", func(t *testing.T) {
		got, err := a.client.List(ctx, "/dir/sub")
		if err != nil || got == nil || len(got) != 0 {
			t.Fatalf("List = %v, %v; want an empty, non-nil list", got, err)
		}
	})
	t.Run("mkdir parents", func(t *testing.T) {
		got, err := a.client.Mkdir(ctx, wire.MkdirRequest{Path: "/p/q/r", Parents: true, Mode: 0o750})
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != wire.FileTypeDir || got.Mode != 0o750 || got.Path != "/p/q/r" {
			t.Fatalf("Mkdir = %+v", got)
		}
		// Again: an existing directory is fine with Parents.
		if _, err := a.client.Mkdir(ctx, wire.MkdirRequest{Path: "/p/q/r", Parents: true}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("mkdir default mode", func(t *testing.T) {
		got, err := a.client.Mkdir(ctx, wire.MkdirRequest{Path: "/m"})
		if err != nil || got.Mode != 0o755 {
			t.Fatalf("Mkdir = %+v, %v", got, err)
		}
	})
	t.Run("rename", func(t *testing.T) {
		mustWrite(t, a.client, "/r1", "content")
		got, err := a.client.Rename(ctx, "/r1", "/p/r2")
		if err != nil {
			t.Fatal(err)
		}
		if got.Path != "/p/r2" || got.Size != 7 {
			t.Fatalf("Rename = %+v", got)
		}
		if _, err := a.client.Stat(ctx, "/r1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("old path: %v", err)
		}
	})
	t.Run("remove file", func(t *testing.T) {
		if err := a.client.Remove(ctx, "/dir/b.txt", false); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(a.root, "dir/b.txt")); !os.IsNotExist(err) {
			t.Fatalf("still there: %v", err)
		}
	})
	t.Run("remove empty dir", func(t *testing.T) {
		if err := a.client.Remove(ctx, "/m", false); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("remove symlink only", func(t *testing.T) {
		if err := a.client.Remove(ctx, "/dir/link", false); err != nil {
			t.Fatal(err)
		}
		if _, err := a.client.Stat(ctx, "/dir/a.txt"); err != nil {
			t.Fatalf("link target: %v", err)
		}
	})
	t.Run("remove recursive", func(t *testing.T) {
		if err := a.client.Remove(ctx, "/dir", true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(a.root, "dir")); !os.IsNotExist(err) {
			t.Fatalf("still there: %v", err)
		}
	})
}

func mustWrite(t *testing.T, c *agentclient.Client, p, content string) {
	t.Helper()
	if _, err := c.WriteFile(t.Context(), p, 0o644, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
}

func TestFileErrors(t *testing.T) {
	a := startAgent(t)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a.client, "/file", "x")
	mustWrite(t, a.client, "/full/child", "x")
	mustWrite(t, a.client, "/full2/child", "x")
	for name, target := range map[string]string{
		"abs":    outside,
		"rel":    strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/"),
		"etc":    "/etc",
		"loop":   "loop",
		"hostfs": "..",
	} {
		if err := os.Symlink(target, filepath.Join(a.root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(a.root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := a.client
	read := func(p string) func(context.Context) error {
		return func(ctx context.Context) error {
			rc, _, err := c.ReadFile(ctx, p)
			if err == nil {
				rc.Close()
			}
			return err
		}
	}
	write := func(p string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.WriteFile(ctx, p, 0o644, strings.NewReader("pwned"))
			return err
		}
	}
	tests := []struct {
		name    string
		op      func(ctx context.Context) error
		want    error
		wantMsg string
	}{
		{"read relative", read("etc/passwd"), errdefs.ErrInvalidArgument, "path must be absolute"},
		{"read empty path", read(""), errdefs.ErrInvalidArgument, "path must be absolute"},
		{"read missing", read("/nope"), errdefs.ErrNotFound, "reading /nope: no such file or directory"},
		{"read dir", read("/full"), errdefs.ErrFailedPrecondition, "reading /full: is a directory"},
		{"read fifo", read("/fifo"), errdefs.ErrFailedPrecondition, "not a regular file"},
		{"read through file", read("/file/x"), errdefs.ErrFailedPrecondition, "not a directory"},
		{"write under a file", write("/file/x"), errdefs.ErrFailedPrecondition, "not a directory"},
		{"write onto a dir", write("/full"), errdefs.ErrFailedPrecondition, "is a directory"},
		{"write relative", write("x"), errdefs.ErrInvalidArgument, "path must be absolute"},
		{"stat missing", func(ctx context.Context) error { _, err := c.Stat(ctx, "/nope"); return err }, errdefs.ErrNotFound, "/nope"},
		{"list a file", func(ctx context.Context) error { _, err := c.List(ctx, "/file"); return err }, errdefs.ErrFailedPrecondition, "not a directory"},
		{"list missing", func(ctx context.Context) error { _, err := c.List(ctx, "/nope"); return err }, errdefs.ErrNotFound, ""},
		{"mkdir existing", func(ctx context.Context) error { _, err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/full"}); return err }, errdefs.ErrAlreadyExists, "file exists"},
		{"mkdir missing parent", func(ctx context.Context) error {
			_, err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/no/dir"})
			return err
		}, errdefs.ErrNotFound, ""},
		{"mkdir parents through file", func(ctx context.Context) error {
			_, err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/file/sub", Parents: true})
			return err
		}, errdefs.ErrFailedPrecondition, ""},
		{"mkdir bad mode", func(ctx context.Context) error {
			_, err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/m", Mode: 0o10000})
			return err
		}, errdefs.ErrInvalidArgument, "invalid mode"},
		{"remove missing", func(ctx context.Context) error { return c.Remove(ctx, "/nope", false) }, errdefs.ErrNotFound, ""},
		{"remove missing recursive", func(ctx context.Context) error { return c.Remove(ctx, "/nope", true) }, errdefs.ErrNotFound, ""},
		{"remove non-empty dir", func(ctx context.Context) error { return c.Remove(ctx, "/full", false) }, errdefs.ErrFailedPrecondition, "directory not empty"},
		{"remove root", func(ctx context.Context) error { return c.Remove(ctx, "/", true) }, errdefs.ErrInvalidArgument, ""},
		{"rename missing", func(ctx context.Context) error { _, err := c.Rename(ctx, "/nope", "/other"); return err }, errdefs.ErrNotFound, ""},
		{"rename onto non-empty dir", func(ctx context.Context) error { _, err := c.Rename(ctx, "/full2", "/full"); return err }, errdefs.ErrFailedPrecondition, ""},
		{"rename relative", func(ctx context.Context) error { _, err := c.Rename(ctx, "/file", "file2"); return err }, errdefs.ErrInvalidArgument, "path must be absolute"},
		{"symlink loop", read("/loop"), errdefs.ErrFailedPrecondition, ""},

		// Escapes from Root through symbolic links.
		{"read through absolute link", read("/abs/secret"), errdefs.ErrPermissionDenied, "escapes"},
		{"read through relative link", read("/rel/secret"), errdefs.ErrPermissionDenied, "escapes"},
		{"read through link to /etc", read("/etc/passwd"), errdefs.ErrPermissionDenied, "escapes"},
		{"read through link to ..", read("/hostfs/" + filepath.Base(outside) + "/secret"), errdefs.ErrPermissionDenied, "escapes"},
		{"write through link", write("/abs/new"), errdefs.ErrPermissionDenied, "escapes"},
		{"overwrite through link", write("/abs/secret"), errdefs.ErrPermissionDenied, "escapes"},
		{"list through link", func(ctx context.Context) error { _, err := c.List(ctx, "/abs"); return err }, errdefs.ErrPermissionDenied, "escapes"},
		{"mkdir through link", func(ctx context.Context) error {
			_, err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/abs/d", Parents: true})
			return err
		}, errdefs.ErrPermissionDenied, "escapes"},
		{"remove through link", func(ctx context.Context) error { return c.Remove(ctx, "/abs/secret", false) }, errdefs.ErrPermissionDenied, "escapes"},
		{"rename through link", func(ctx context.Context) error { _, err := c.Rename(ctx, "/abs/secret", "/stolen"); return err }, errdefs.ErrPermissionDenied, "escapes"},
		{"rename into link", func(ctx context.Context) error { _, err := c.Rename(ctx, "/file", "/abs/planted"); return err }, errdefs.ErrPermissionDenied, "escapes"},
		{"dot-dot is cleaned to root", read("/../../" + strings.TrimPrefix(outside, "/") + "/secret"), errdefs.ErrNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op(t.Context())
			if !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want kind %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error = %q, want it to mention %q", err, tt.wantMsg)
			}
			if strings.Contains(err.Error(), a.root) {
				t.Fatalf("error %q reveals the host root", err)
			}
		})
	}
	// Nothing outside Root was touched.
	entries, _ := os.ReadDir(outside)
	if len(entries) != 1 {
		t.Fatalf("outside dir has %d entries, want only the secret", len(entries))
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "host secret" {
		t.Fatalf("secret = %q", b)
	}
	// Removing a link that points outside removes only the link.
	if err := c.Remove(t.Context(), "/abs", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "secret")); err != nil {
		t.Fatal(err)
	}
}

// A file that cannot be read is answered with an error of a kind that says
// trying again will not help, not with a cut connection (which the client
// takes for a lost agent, unavailable); pseudo files that can be read
// still stream. The agent runs without Root, as inside a sandbox, on the
// real /proc of this process.
func TestReadUnreadableFile(t *testing.T) {
	a := startAgentWith(t, agentserver.Options{})
	tests := []struct {
		name     string
		path     string
		wantKind error  // nil: the read succeeds
		want     string // in the error, or in the content
	}{
		{"memory at offset 0", "/proc/self/mem", errdefs.ErrFailedPrecondition, "reading /proc/self/mem: input/output error"},
		{"pseudo file of size 0", "/proc/self/status", nil, "Name:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, _, err := a.client.ReadFile(t.Context(), tt.path)
			if tt.wantKind == nil {
				if err != nil {
					t.Fatal(err)
				}
				defer rc.Close()
				b, err := io.ReadAll(rc)
				if err != nil || !strings.Contains(string(b), tt.want) {
					t.Fatalf("read %q, %v; want it to hold %q", b, err, tt.want)
				}
				return
			}
			if err == nil {
				rc.Close()
				t.Fatal("read succeeded")
			}
			if !errors.Is(err, tt.wantKind) || errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want kind %v saying %q", err, tt.wantKind, tt.want)
			}
		})
	}
	// The connection survived the refusal.
	if got, _ := readAll(t, a.client, "/proc/self/status"); !bytes.Contains(got, []byte("Name:")) {
		t.Fatalf("read after the refusal: %q", got)
	}
}

// A full file system is reported as resource_exhausted.
func TestWriteFileNoSpace(t *testing.T) {
	testutil.RequiresRoot(t)
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", root, err)
		}
	})
	a := startAgentWith(t, agentserver.Options{Root: root})
	_, err := a.client.WriteFile(t.Context(), "/big", 0o644, bytes.NewReader(make([]byte, 1<<20)))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("error = %v, want resource_exhausted saying no space left", err)
	}
}

// Without Root the agent uses its own view of the file system, as inside a
// sandbox, where absolute links are ordinary.
func TestFilesWithoutRoot(t *testing.T) {
	a := startAgentWith(t, agentserver.Options{})
	dir := t.TempDir()
	if err := os.Symlink(dir, filepath.Join(dir, "self")); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a.client, dir+"/self/f", "via link")
	got, _ := readAll(t, a.client, dir+"/f")
	if string(got) != "via link" {
		t.Fatalf("content = %q", got)
	}
}

// A Root that cannot be opened leaves exec working and file operations
// unavailable.
func TestBadRoot(t *testing.T) {
	a := startAgentWith(t, agentserver.Options{Root: filepath.Join(t.TempDir(), "missing")})
	if _, err := a.client.Stat(t.Context(), "/"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Stat error = %v, want unavailable", err)
	}
	res, err := runExec(t.Context(), a.client, wire.ExecRequest{Cmd: []string{"true"}})
	if err != nil || res.code() != 0 {
		t.Fatalf("exec: %v, code %d", err, res.code())
	}
}
