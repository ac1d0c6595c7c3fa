package agentserver_test

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/testutil"
	"github.com/corralrun/corral/internal/untar"
)

// A plain write and a tar upload give a file the same mode, the one asked
// for, setuid, setgid and sticky bits included, whether the file is new or
// replaced. The agent binary runs on the host and, as in a sandbox, in a
// user namespace of its own: there it lacks CAP_FSETID over the host, and
// the kernel clears setuid and setgid whenever it writes to a file.
func TestModeBitsOnBothPaths(t *testing.T) {
	testutil.RequiresRoot(t)
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
	modes := []struct {
		name string
		bits int64 // as a tar header holds them
		mode fs.FileMode
	}{
		{"plain", 0o644, 0o644},
		{"setuid", 0o4755, 0o755 | fs.ModeSetuid},
		{"setgid", 0o2755, 0o755 | fs.ModeSetgid},
		{"setuid and setgid", 0o6750, 0o750 | fs.ModeSetuid | fs.ModeSetgid},
		{"sticky", 0o1777, 0o777 | fs.ModeSticky},
	}
	for _, where := range []struct {
		name string
		sys  *syscall.SysProcAttr
	}{
		{"host", nil},
		{"user namespace", &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: idmap, GidMappings: idmap}},
	} {
		t.Run(where.name, func(t *testing.T) {
			p := startAgentBinary(t, testutil.AgentBinary(t), where.sys)
			if p.ready != "ok\n" {
				t.Fatalf("ready fd said %q; log:\n%s", p.ready, readLog(p.log))
			}
			dir := t.TempDir()
			for _, m := range modes {
				t.Run(m.name, func(t *testing.T) {
					var archive bytes.Buffer
					tw := tar.NewWriter(&archive)
					if err := tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: m.bits, Size: 2}); err != nil {
						t.Fatal(err)
					}
					tw.Write([]byte("x\n"))
					tw.Close()
					plain := filepath.Join(dir, "plain", m.name)
					untarred := filepath.Join(dir, "tar", m.name)
					writes := []struct {
						name  string
						file  string
						write func() error
					}{
						{"plain write", plain, func() error {
							_, err := p.client.WriteFile(t.Context(), plain, m.mode, strings.NewReader("x\n"))
							return err
						}},
						{"tar upload", filepath.Join(untarred, "f"), func() error {
							return p.client.WriteArchive(t.Context(), untarred, bytes.NewReader(archive.Bytes()))
						}},
					}
					for _, w := range writes {
						for _, round := range []string{"new file", "replaced file"} {
							if err := w.write(); err != nil {
								t.Fatalf("%s, %s: %v", w.name, round, err)
							}
							fi, err := os.Stat(w.file)
							if err != nil {
								t.Fatal(err)
							}
							if got := fi.Mode() & untar.ModeBits; got != m.mode {
								t.Errorf("%s, %s: mode %v, want %v", w.name, round, got, m.mode)
							}
						}
					}
				})
			}
		})
	}
}
