package e2e

import (
	"archive/tar"
	"bytes"
	"github.com/corralrun/corral/internal/testutil/registrytest"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	corral "github.com/corralrun/corral/sdk"
)

// entry is one member of a hand-made layer.
type entry struct {
	name, body, link string
	typ              byte
}

// entriesLayer makes a layer of the given entries, in order.
func entriesLayer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ == tar.TypeDir {
			hdr.Mode = 0o755
		}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	return registrytest.Layer(t, buf.Bytes())
}

// TestPullImage: an image whose upper layer deletes a file of the lower
// one pulls into a template whose sandboxes see the right files, and run
// with the image's environment, working directory and user.
func TestPullImage(t *testing.T) {
	forEachStorage(t, func(t *testing.T, storage string) {
		d := startDaemon(t, storage)
		reg := registrytest.Start(t)
		img := registrytest.Image(t, v1.Config{
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "APP_MODE=e2e"},
			WorkingDir: "/app",
			User:       "user",
			Cmd:        []string{"sh"},
		},
			registrytest.BusyboxLayer(t),
			entriesLayer(t, entry{name: "etc/doomed", body: "delete me", typ: tar.TypeReg}, entry{name: "data/", typ: tar.TypeDir},
				entry{name: "data/kept", body: "kept", typ: tar.TypeReg}),
			entriesLayer(t, entry{name: "etc/.wh.doomed", typ: tar.TypeReg}, entry{name: "app/", typ: tar.TypeDir},
				entry{name: "app/hello.txt", body: "hello from the image", typ: tar.TypeReg}),
		)
		ref := reg.Push(t, "e2e/app:1", img)
		began := time.Now()
		out, errOut, code := d.corral("template", "pull", "app", ref, "--insecure")
		if code != 0 || strings.TrimSpace(out) != "app" {
			t.Fatalf("template pull: code %d, stdout %q, stderr:\n%s", code, out, errOut)
		}
		t.Logf("pulled a three-layer busybox image (%s storage) in %s", storage, time.Since(began).Round(time.Millisecond))
		if !strings.Contains(errOut, "pulled "+ref) {
			t.Errorf("pull output lacks the summary:\n%s", errOut)
		}
		tmpl, err := d.Client.Template(t.Context(), "app")
		if err != nil {
			t.Fatal(err)
		}
		if tmpl.Source != "pull" || tmpl.Image != ref || tmpl.Defaults == nil || tmpl.Defaults.WorkingDir != "/app" {
			t.Fatalf("template record %+v", tmpl)
		}

		sb := d.create(t, corral.CreateOptions{Template: "app"})
		checks := []struct{ shell, want string }{
			{"pwd", "/app\n"},
			{"id -un", "user\n"},
			{"env | grep -E '^(APP_MODE|PATH)=' | sort", "APP_MODE=e2e\nPATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin\n"},
			{"ls /etc | grep -c doomed; ls /data; cat hello.txt", "0\nkept\nhello from the image"},
		}
		for _, c := range checks {
			if got, res := d.execOut(t, sb.ID, c.shell); got != c.want || res.ExitCode != 0 {
				t.Errorf("%s: got %q (exit %d), want %q", c.shell, got, res.ExitCode, c.want)
			}
		}
		// The request still wins over the template's defaults.
		out, errOut, code = d.corral("exec", "--user", "root", "--cwd", "/", "-e", "APP_MODE=override", sb.ID, "--", "sh", "-c", "id -un; pwd; echo $APP_MODE")
		if code != 0 || out != "root\n/\noverride\n" {
			t.Errorf("exec with overrides: code %d, %q, %s", code, out, errOut)
		}
		// A second pull downloads nothing.
		_, errOut, code = d.corral("template", "pull", "app2", ref)
		if code != 0 || !strings.Contains(errOut, "already cached") {
			t.Errorf("second pull: code %d:\n%s", code, errOut)
		}
	})
}

// TestPullRefusesMaliciousLayers: layers that climb out of the root or
// write through a symlink to outside are refused, no template is made,
// and nothing lands outside the storage.
func TestPullRefusesMaliciousLayers(t *testing.T) {
	d := startDaemon(t, "btrfs")
	reg := registrytest.Start(t)
	tag := randHex(4)
	escape := "escape-" + tag
	victim := filepath.Join(os.TempDir(), "corral-pwned-"+tag)
	t.Cleanup(func() { os.Remove(victim) })
	layers := map[string]v1.Layer{
		"dotdot": entriesLayer(t, entry{name: "etc/", typ: tar.TypeDir},
			entry{name: "etc/../../../../" + escape, body: "x", typ: tar.TypeReg}),
		"abs-symlink": entriesLayer(t, entry{name: "evil", link: filepath.Dir(victim), typ: tar.TypeSymlink},
			entry{name: "evil/" + filepath.Base(victim), body: "x", typ: tar.TypeReg}),
		"rel-symlink": entriesLayer(t, entry{name: "up", link: "../../../../../../../..", typ: tar.TypeSymlink},
			entry{name: "up" + victim, body: "x", typ: tar.TypeReg}),
	}
	for kind, l := range layers {
		t.Run(kind, func(t *testing.T) {
			ref := reg.Push(t, "e2e/bad-"+kind+":1", registrytest.Image(t, v1.Config{}, registrytest.BusyboxLayer(t), l))
			_, errOut, code := d.corral("template", "pull", "bad-"+kind, ref)
			if code == 0 || !strings.Contains(errOut, "invalid_argument") {
				t.Fatalf("pull of a malicious layer: code %d:\n%s", code, errOut)
			}
			if _, err := d.Client.Template(t.Context(), "bad-"+kind); err == nil {
				t.Error("a refused pull left a template")
			}
		})
	}
	if _, err := os.Lstat(victim); err == nil {
		t.Errorf("a layer wrote %s", victim)
	}
	// Nothing named escape-* anywhere in the daemon's directory tree but
	// inside the image cache (which holds the layer, compressed).
	base := filepath.Dir(d.StateDir)
	filepath.WalkDir(base, func(p string, e fs.DirEntry, err error) error {
		if err == nil && strings.Contains(e.Name(), escape) {
			t.Errorf("escaping entry written at %s", p)
		}
		return nil
	})
	if _, err := os.Lstat(filepath.Join(filepath.Dir(base), escape)); err == nil {
		t.Errorf("escaping entry written next to the state dir")
	}
}

// TestBuildDockerfile: a Dockerfile with five RUN steps builds in real
// sandboxes; an unchanged rebuild runs nothing; changing the third RUN
// reruns it and the ones after it only.
func TestBuildDockerfile(t *testing.T) {
	forEachStorage(t, func(t *testing.T, storage string) {
		d := startDaemon(t, storage)
		reg := registrytest.Start(t)
		base := reg.Push(t, "e2e/busybox:1", registrytest.Image(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}}, registrytest.BusyboxLayer(t)))
		ctxDir := t.TempDir()
		write := func(third string) string {
			df := "FROM " + base + "\n" +
				"RUN echo 1 > /one\n" +
				"RUN echo 2 > /two && cat /one >> /two\n" +
				"RUN " + third + "\n" +
				"RUN echo 4 > /four\n" +
				"RUN echo 5 > /five; id -u > /uid\n" +
				"WORKDIR /work\n" +
				"COPY note.txt .\n"
			p := filepath.Join(ctxDir, "Dockerfile")
			if err := os.WriteFile(p, []byte(df), 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
		if err := os.WriteFile(filepath.Join(ctxDir, "note.txt"), []byte("from the context\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		build := func(name, dockerfile string) (string, time.Duration) {
			t.Helper()
			began := time.Now()
			out, errOut, code := d.corral("template", "build", name, "-f", dockerfile, ctxDir)
			took := time.Since(began)
			if code != 0 || strings.TrimSpace(out) != name {
				t.Fatalf("build %s: code %d, stdout %q, stderr:\n%s", name, code, out, errOut)
			}
			return errOut, took
		}
		contents := func(tmpl string) string {
			t.Helper()
			out, errOut, code := d.corral("run", "--template", tmpl, "--", "sh", "-c", "cat /one /two /three /four /five /uid; pwd; cat note.txt")
			if code != 0 {
				t.Fatalf("run in %s: code %d: %s", tmpl, code, errOut)
			}
			return out
		}

		log1, took := build("five", write("echo 3 > /three"))
		t.Logf("first build (%s storage): %s", storage, took.Round(time.Millisecond))
		if !strings.Contains(log1, "ran steps 1, 2, 3, 4, 5, 6, 8 of 8") {
			t.Errorf("first build log:\n%s", log1)
		}
		// Steps run as root in a user namespace: root inside the sandbox.
		want := "1\n2\n1\n3\n4\n5\n0\n/work\nfrom the context\n"
		if got := contents("five"); got != want {
			t.Errorf("built tree: %q, want %q", got, want)
		}

		// RUN steps ran as root of a user namespace, not as host root:
		// what they created belongs to the sandbox ID range.
		made, _ := filepath.Glob(filepath.Join(d.StateDir, "build", "snapshots", "*", "one"))
		onBtrfs, _ := filepath.Glob(filepath.Join(d.StateDir, "storage", "mnt", "build", "snapshots", "*", "one"))
		made = append(made, onBtrfs...)
		if len(made) == 0 {
			t.Errorf("no build snapshot holds /one")
		}
		for _, p := range made {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Error(err)
			} else if uid := fi.Sys().(*syscall.Stat_t).Uid; uid < 1<<31 {
				t.Errorf("%s made by a RUN step is owned by host uid %d, want the sandbox range", p, uid)
			}
		}

		log2, took := build("five-again", write("echo 3 > /three"))
		t.Logf("unchanged rebuild (%s storage): %s", storage, took.Round(time.Millisecond))
		if !strings.Contains(log2, "all 8 steps cached") || strings.Contains(log2, "done in") {
			t.Errorf("unchanged rebuild ran steps:\n%s", log2)
		}
		if took >= time.Second {
			t.Errorf("unchanged rebuild took %s, want under a second", took)
		}

		// --no-cache runs every step again; the cache still serves later
		// builds.
		out, logNC, code := d.corral("template", "build", "five-nocache", "--no-cache", "-f", write("echo 3 > /three"), ctxDir)
		if code != 0 || strings.TrimSpace(out) != "five-nocache" || !strings.Contains(logNC, "ran steps 1, 2, 3, 4, 5, 6, 8 of 8") {
			t.Errorf("--no-cache build: code %d, stdout %q:\n%s", code, out, logNC)
		}

		log3, took := build("five-changed", write("echo three > /three"))
		t.Logf("rebuild with the third RUN changed (%s storage): %s", storage, took.Round(time.Millisecond))
		for _, want := range []string{
			"step 2/8: RUN echo 1 > /one (cached)",
			"step 3/8: RUN echo 2 > /two && cat /one >> /two (cached)",
			"ran steps 4, 5, 6, 8 of 8",
		} {
			if !strings.Contains(log3, want) {
				t.Errorf("changed rebuild log lacks %q:\n%s", want, log3)
			}
		}
		if got, want := contents("five-changed"), "1\n2\n1\nthree\n4\n5\n0\n/work\nfrom the context\n"; got != want {
			t.Errorf("rebuilt tree: %q, want %q", got, want)
		}

		// A failing step says which, and with what status.
		_, errOut, code := d.corral("template", "build", "broken", "-f", write("exit 3"), ctxDir)
		if code == 0 || !strings.Contains(errOut, "failed_precondition") || !strings.Contains(errOut, "step 4/8 (line 4) RUN") ||
			!strings.Contains(errOut, "status 3") {
			t.Errorf("failing RUN: code %d:\n%s", code, errOut)
		}
		bad := filepath.Join(ctxDir, "Bad.Dockerfile")
		os.WriteFile(bad, []byte("FROM "+base+"\nRUN true\nFROB it\n"), 0o644)
		_, errOut, code = d.corral("template", "build", "bad", "-f", bad)
		if code == 0 || !strings.Contains(errOut, "invalid_argument") || !strings.Contains(errOut, "line 3") {
			t.Errorf("bad Dockerfile: code %d:\n%s", code, errOut)
		}

		// Deleting the templates lets the collector drop the build cache
		// and the base image.
		for _, n := range []string{"five", "five-again", "five-nocache", "five-changed"} {
			if _, errOut, code := d.corral("template", "rm", n); code != 0 {
				t.Fatalf("template rm %s: %s", n, errOut)
			}
		}
		blobs := filepath.Join(d.StateDir, "images", "blobs", "sha256")
		deadline := time.Now().Add(10 * time.Second)
		for {
			left, _ := os.ReadDir(blobs)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("image cache still holds %d blobs after the templates were deleted", len(left))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
