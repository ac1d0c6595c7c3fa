package daemontest

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/server"
	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// CodeInterpreterTemplate gives the daemon a template name made with the
// code-interpreter recipe. The first call of a test run builds it through
// the daemon (`--recipe code-interpreter`: debootstrap and apt, minutes)
// and keeps a tarball of its tree in the system's temporary directory;
// later calls, in any test package of the same run, import that tarball
// and give it the recipe's service. It needs the Debian mirror, so it
// runs only with CORRAL_TEST_DEBOOTSTRAP=1 (.ci/run sets it) and skips
// otherwise.
func (d *Daemon) CodeInterpreterTemplate(name string) {
	t := d.t
	t.Helper()
	if os.Getenv("CORRAL_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("set CORRAL_TEST_DEBOOTSTRAP=1 to build the code-interpreter template (minutes, needs the Debian mirror)")
	}
	testutil.RequiresBinary(t, "tar")
	cacheDir := filepath.Join(os.TempDir(), "corral-test-cache")
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// One builder at a time across test binaries: the others wait for its
	// tarball.
	lock, err := os.OpenFile(filepath.Join(cacheDir, "code-interpreter.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	tarball := filepath.Join(cacheDir, "code-interpreter.tar")
	if f, err := os.Open(tarball); err == nil {
		defer f.Close()
		begin := time.Now()
		if _, err := d.Client.ImportTemplate(ctx, name, f); err != nil {
			t.Fatalf("importing the cached code-interpreter tree: %v", err)
		}
		var sv corral.Service
		b, _ := json.Marshal(server.CodeInterpreterService())
		json.Unmarshal(b, &sv)
		if _, err := d.Client.SetTemplateService(ctx, name, &sv); err != nil {
			t.Fatalf("setting the code interpreter service: %v", err)
		}
		t.Logf("code-interpreter template imported from the test cache in %s", time.Since(begin).Round(time.Millisecond))
		return
	}
	begin := time.Now()
	var log strings.Builder
	if _, err := d.Client.BuildTemplate(ctx, name, corral.BuildOptions{Recipe: "code-interpreter"}, &log); err != nil {
		out := log.String()
		t.Fatalf("building the code-interpreter template: %v\n%s", err, out[max(0, len(out)-4000):])
	}
	t.Logf("code-interpreter template built in %s", time.Since(begin).Round(time.Second))
	tree := d.templateTree(name)
	tmp := tarball + ".tmp"
	if out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "-C", tree, "-cf", tmp, ".").CombinedOutput(); err != nil {
		os.Remove(tmp)
		t.Fatalf("caching the code-interpreter tree: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, tarball); err != nil {
		t.Fatal(err)
	}
}

// templateTree finds the directory of template name in the daemon's
// storage: a templates/<name> directory with a root file system.
func (d *Daemon) templateTree(name string) string {
	d.t.Helper()
	var found string
	for _, top := range []string{d.StateDir, d.RunDir} {
		filepath.WalkDir(top, func(p string, e fs.DirEntry, err error) error {
			if err != nil || found != "" {
				return fs.SkipDir
			}
			if !e.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(top, p)
			if strings.Count(rel, "/") > 5 {
				return fs.SkipDir
			}
			if filepath.Base(p) == name && filepath.Base(filepath.Dir(p)) == "templates" {
				if _, err := os.Stat(filepath.Join(p, "etc", "debian_version")); err == nil {
					found = p
					return fs.SkipAll
				}
			}
			return nil
		})
	}
	if found == "" {
		d.t.Fatalf("template %s has no tree under %s or %s", name, d.StateDir, d.RunDir)
	}
	return found
}
