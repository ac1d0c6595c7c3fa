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
}

func TestRunDirKeepsLegacyState(t *testing.T) {
	for _, tc := range []struct {
		name   string
		files  []string
		legacy bool
	}{
		{"fresh", nil, false},
		{"empty runtime dirs", []string{"runc/state/", "gvisor/state/", "network/netns/", "netfiles/"}, false},
		{"network spares only", []string{"network/netns/.spare-1", "network/netns/.spare-2.target"}, false},
		{"runc container", []string{"runc/state/abc/state.json"}, true},
		{"gVisor sandbox", []string{"gvisor/state/abc/"}, true},
		{"network namespace", []string{"network/netns/abc"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			for _, f := range tc.files {
				p := filepath.Join(state, f)
				dir := filepath.Dir(p)
				if strings.HasSuffix(f, "/") {
					dir = p
				}
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if !strings.HasSuffix(f, "/") {
					if err := os.WriteFile(p, nil, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			run := filepath.Join(t.TempDir(), "run")
			dir, legacy := runDir(state, run)
			want := run
			if tc.legacy {
				want = state
			}
			if dir != want || legacy != tc.legacy {
				t.Errorf("runDir = %s, %v; want %s, %v", dir, legacy, want, tc.legacy)
			}
		})
	}
}

func TestRemoveEmptyDirs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	for _, d := range []string{"runc/state", "runc/sandboxes", "network/netns", "gvisor"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "network/netns/abc"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	removeEmptyDirs(dir)
	var left []string
	filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil {
			left = append(left, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	if want := []string{"", "/network", "/network/netns", "/network/netns/abc"}; !slices.Equal(left, want) {
		t.Errorf("left %q, want %q", left, want)
	}
	if err := os.Remove(filepath.Join(dir, "network/netns/abc")); err != nil {
		t.Fatal(err)
	}
	removeEmptyDirs(dir)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("empty run dir not removed: %v", err)
	}
}
