package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDefaultRunDir(t *testing.T) {
	a, b := DefaultRunDir("/var/lib/corral"), DefaultRunDir("/srv/corral")
	if a != DefaultRunDir("/var/lib/corral") {
		t.Errorf("DefaultRunDir is not a function of the state dir: %s", a)
	}
	if a == b {
		t.Errorf("two state dirs share the run dir %s", a)
	}
	if !strings.HasPrefix(a, DefaultRunRoot+"/state-") {
		t.Errorf("DefaultRunDir = %s, want it under %s", a, DefaultRunRoot)
	}
	if err := checkRunDir(a); err != nil {
		t.Error(err)
	}
	if err := checkRunDir("/run/" + strings.Repeat("x", 60)); err == nil {
		t.Error("a run dir too long for agent sockets was accepted")
	}
}

// makeFiles creates files (and directories, for names ending in /) under
// dir.
func makeFiles(t *testing.T, dir string, files []string) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(dir, f)
		parent := filepath.Dir(p)
		if strings.HasSuffix(f, "/") {
			parent = p
		}
		if err := os.MkdirAll(parent, 0o700); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(f, "/") {
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRunDirKeepsOneWithSandboxes checks which run dir a daemon takes: the
// configured one, unless the one recorded at the last start (or, without
// a record, the state dir of an older Corral) still holds anything of
// sandboxes or spares.
func TestRunDirKeepsOneWithSandboxes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		files    []string
		recorded bool // the old run dir is recorded; else it is the state dir
		kept     bool
	}{
		{"fresh", nil, false, false},
		{"empty runtime dirs", []string{"runc/state/", "gvisor/state/", "network/netns/", "netfiles/"}, false, false},
		{"runc container", []string{"runc/state/abc/state.json"}, false, true},
		{"half-made runc sandbox", []string{"runc/sandboxes/abc/"}, false, true},
		{"user namespace spare", []string{"runc/userns-spares/1/"}, false, true},
		{"gVisor sandbox", []string{"gvisor/state/abc_sandbox:abc.state"}, false, true},
		{"network namespace", []string{"network/netns/abc"}, false, true},
		{"network spare", []string{"network/netns/.spare-1"}, false, true},
		{"recorded, empty", []string{"runc/state/"}, true, false},
		{"recorded, with a container", []string{"runc/state/abc/state.json"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			old := state
			if tc.recorded {
				old = filepath.Join(t.TempDir(), "old-run")
				if err := recordRunDir(state, old); err != nil {
					t.Fatal(err)
				}
			}
			makeFiles(t, old, tc.files)
			run := filepath.Join(t.TempDir(), "run")
			dir, kept, err := runDir(state, run)
			if err != nil {
				t.Fatal(err)
			}
			want := run
			if tc.kept {
				want = old
			}
			if dir != want || kept != tc.kept {
				t.Errorf("runDir = %s, %v; want %s, %v", dir, kept, want, tc.kept)
			}
		})
	}
}

func TestRemoveRunDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := makeRunDir(dir); err != nil {
		t.Fatal(err)
	}
	for _, e := range runDirEntries {
		if err := os.Mkdir(filepath.Join(dir, e), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	makeFiles(t, dir, []string{"network/netns/abc", "daemon.lock", "mine/"})
	removeRunDir(dir)
	var left []string
	filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil {
			left = append(left, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	// What the daemon did not make stays, and so do its parents.
	if want := []string{"", "/mine", "/network", "/network/netns", "/network/netns/abc"}; !slices.Equal(left, want) {
		t.Errorf("left %q, want %q", left, want)
	}
	for _, p := range []string{"network/netns/abc", "mine"} {
		if err := os.Remove(filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	removeRunDir(dir)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("empty run dir not removed: %v", err)
	}
}

func TestMakeRunDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := makeRunDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("run dir mode %v, %v; want 0700", fi.Mode(), err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := makeRunDir(link); err == nil {
		t.Error("a symbolic link was taken as the run dir")
	}
}
