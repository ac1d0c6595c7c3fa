package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

// linkedRoot makes a sandbox root whose symlinks lead targets elsewhere.
func linkedRoot(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"etc", "data", "home/x", "proc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for link, dest := range map[string]string{
		"work": "/etc", "rel": "../../etc", "home/x/up": "../..", "link2": "/data",
		"loop": "/loop", "dangling": "/proc/nothere", "w2": "/data/sub", "chain": "link2",
	} {
		if err := os.Symlink(dest, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestResolveTargets(t *testing.T) {
	root := t.TempDir()
	linkedRoot(t, root)
	for _, tt := range []struct {
		name    string
		targets []string
		want    []string
		err     string // in the invalid_argument refusal
	}{
		{name: "plain", targets: []string{"/data", "/new/dir"}, want: []string{"/data", "/new/dir"}},
		{name: "link to a free path", targets: []string{"/link2/in", "/chain/other"}, want: []string{"/data/in", "/data/other"}},
		{name: "link to a missing path", targets: []string{"/w2/new"}, want: []string{"/data/sub/new"}},
		{name: "climbing link stays in the root", targets: []string{"/rel/app"}, want: []string{"/etc/app"}},
		{name: "link to /etc", targets: []string{"/work"}, err: "/work is a symlink"},
		{name: "link above the root", targets: []string{"/rel"}, err: "/rel is a symlink"},
		{name: "dot-dot link to /proc", targets: []string{"/home/x/up/proc"}, err: "/home/x/up is a symlink"},
		{name: "dangling link into /proc", targets: []string{"/dangling"}, err: "belongs to the runtime"},
		{name: "loop", targets: []string{"/loop"}, err: "too many symlinks"},
		{name: "file", targets: []string{"/file/x"}, err: "not a directory"},
		{name: "inside another through a link", targets: []string{"/data", "/link2/inner"}, err: "inside mount /data"},
		{name: "the same through a link", targets: []string{"/data", "/link2"}, err: "named twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ms := make([]Mount, len(tt.targets))
			for i, target := range tt.targets {
				ms[i] = Mount{Source: "/h", Target: target}
			}
			got, err := resolveTargets(root, ms)
			if tt.err != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("resolveTargets(%v) = %v, %v; want invalid_argument saying %q", tt.targets, got, err, tt.err)
				}
				return
			}
			if err != nil || strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("resolveTargets(%v) = %v, %v; want %v", tt.targets, got, err, tt.want)
			}
		})
	}
}

// TestMountsTargetThroughTemplateSymlink creates sandboxes of a template
// whose /work is a symlink to /etc: a mount at /work is refused naming
// the symlink, with nothing left, and one at a path the symlink leads to a
// free place reaches the driver as the resolved path.
func TestMountsTargetThroughTemplateSymlink(t *testing.T) {
	fm := newFakeMounter()
	h := newHarness(t, func(c *Config) { c.Mounter = fm })
	ctx := t.Context()
	if _, err := h.m.CreateTemplate(ctx, "linked", "test", func(dir string) error {
		linkedRoot(t, dir)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := h.m.Create(ctx, Spec{Template: "linked", Mounts: []Mount{{Source: "/repo", Target: "/work"}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "/work is a symlink") {
		t.Fatalf("create with a target through a symlink to /etc = %v, want invalid_argument naming the symlink", err)
	}
	h.assertClean(t)
	sb, err := h.m.Create(ctx, Spec{Template: "linked", Mounts: []Mount{{Source: "/repo", Target: "/link2/in"}}})
	if err != nil {
		t.Fatal(err)
	}
	if ds, err := h.drv.Spec(sb.ID); err != nil || len(ds.Mounts) != 1 || ds.Mounts[0].Target != "/data/in" {
		t.Fatalf("the driver got mounts %+v (%v), want the target /data/in", ds.Mounts, err)
	}
	if sb.Mounts[0].Target != "/link2/in" {
		t.Fatalf("the record's target became %s", sb.Mounts[0].Target)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}
