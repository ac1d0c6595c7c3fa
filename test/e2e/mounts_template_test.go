package e2e

import (
	"archive/tar"
	"bytes"
	"github.com/corralrun/corral/internal/testutil/registrytest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// userDirOwner owns the host directory of TestMountsDefaultUser: not the
// template user's uid, so that a mapping shows up as one.
const userDirOwner = 2000

// TestMountsTemplate mounts host directories into sandboxes of a template
// whose image names a user and has symlinks: on runc and gVisor that user
// owns a rw directory inside and writes to it as the directory's owner,
// the sandbox's root may still change the owner's files, and a target
// through the template's symlink to /etc is refused while one through a
// symlink to a free path is mounted where the symlink leads.
func TestMountsTemplate(t *testing.T) {
	testutil.RequiresBinary(t, "runsc")
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(allowed, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, e2eStorage, "--allow-mount", allowed, "--runtimes", "gvisor")
	reg := registrytest.Start(t)
	ref := reg.Push(t, "e2e/user:1", registrytest.Image(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}, User: "user"}, registrytest.BusyboxLayer(t),
		entriesLayer(t, entry{name: "work", link: "/etc", typ: tar.TypeSymlink}, entry{name: "scratch", link: "tmp/../../tmp", typ: tar.TypeSymlink})))
	if out, errOut, code := d.corral("template", "pull", "as-user", ref, "--insecure"); code != 0 {
		t.Fatalf("template pull: code %d, %s%s", code, out, errOut)
	}
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			dir := filepath.Join(allowed, rt)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			existing := filepath.Join(dir, "existing")
			if err := os.WriteFile(existing, []byte("host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{dir, existing} {
				if err := os.Chown(p, userDirOwner, userDirOwner); err != nil {
					t.Fatal(err)
				}
			}
			_, err := d.Client.Create(t.Context(), corral.CreateOptions{Template: "as-user", Runtime: rt, Mounts: []corral.Mount{{Source: dir, Target: "/work"}}})
			if corral.ErrorCode(err) != corral.CodeInvalidArgument || !strings.Contains(err.Error(), "/work is a symlink") {
				t.Errorf("a target through the template's symlink to /etc: %v; want %s naming the symlink", err, corral.CodeInvalidArgument)
			}
			sb := d.create(t, corral.CreateOptions{Template: "as-user", Runtime: rt, Mounts: []corral.Mount{{Source: dir, Target: "/rw"}, {Source: dir, Target: "/scratch/in", Mode: corral.MountReadOnly}}})
			out, res := d.execOut(t, sb.ID, "id -u; stat -c %u:%g /rw /rw/existing && cat /tmp/in/existing && echo user > /rw/byuser && mkdir /rw/userdir")
			if want := "1000\n1000:1000\n1000:1000\nhost\n"; res.ExitCode != 0 || out != want {
				t.Errorf("the template's user in the rw mount: exit %d, %q; want %q", res.ExitCode, out, want)
			}
			// Root overrides the owner's mode; what it makes is the
			// stored root's on the host, as in its own files.
			var buf bytes.Buffer
			res, err = d.Client.Exec(t.Context(), sb.ID, corral.ExecOptions{User: "root", Shell: "echo root >> /rw/existing && echo root > /rw/byroot && stat -c %u /rw/byroot /rw/byuser",
				Stdout: &buf, Stderr: &buf})
			if want := "0\n1000\n"; err != nil || res.ExitCode != 0 || buf.String() != want {
				t.Errorf("root in the rw mount: %v, %+v, %q; want %q", err, res, buf.String(), want)
			}
			checkHostFile(t, existing, "host\nroot\n")
			for _, name := range []string{"existing", "byuser", "userdir"} {
				checkOwnedBy(t, filepath.Join(dir, name), userDirOwner)
			}
			checkOwnedBy(t, filepath.Join(dir, "byroot"), driver.StoredIDBase)
			if err := d.Client.Delete(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			// The mount of dir is gone (the network of the sandbox is torn
			// down in the background, so its ID is not sought).
			checkUnmounted(t, dir, "")
		})
	}
}

// checkOwnedBy fails t unless name belongs to uid and gid id on the host.
func checkOwnedBy(t *testing.T, name string, id uint32) {
	t.Helper()
	fi, err := os.Lstat(name)
	if err != nil {
		t.Errorf("lstat %s: %v", name, err)
		return
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != id || st.Gid != id {
		t.Errorf("%s belongs to %d:%d on the host, want %d:%d", name, st.Uid, st.Gid, id, id)
	}
}
