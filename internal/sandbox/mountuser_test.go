package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

func TestLookupUser(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nbad:x:no:1\napp:x:1001:50::/:/bin/sh\n",
		"group":  "root:x:0:\nstaff:x:50:user\nusers:x:100:\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		spec     string
		uid, gid uint32
		fails    bool
	}{
		{spec: "user", uid: 1000, gid: 1000},
		{spec: "1001", uid: 1001, gid: 50},
		{spec: "4242", uid: 4242, gid: 0},
		{spec: "user:users", uid: 1000, gid: 100},
		{spec: "app:7", uid: 1001, gid: 7},
		{spec: "0", uid: 0, gid: 0},
		{spec: "nobody", fails: true},
		{spec: "bad", fails: true},
		{spec: "user:nogroup", fails: true},
		{spec: ":users", fails: true},
	} {
		t.Run(tt.spec, func(t *testing.T) {
			uid, gid, err := lookupUser(root, tt.spec)
			if tt.fails {
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("lookupUser(%q) = %d:%d, %v; want failed_precondition", tt.spec, uid, gid, err)
				}
				return
			}
			if err != nil || uid != tt.uid || gid != tt.gid {
				t.Fatalf("lookupUser(%q) = %d:%d, %v; want %d:%d", tt.spec, uid, gid, err, tt.uid, tt.gid)
			}
		})
	}
}

// TestMountsForTheTemplateUser creates sandboxes of templates with and
// without a default user: the Mounter is told the user's IDs, which the
// sandbox's /etc/passwd gives, or root's.
func TestMountsForTheTemplateUser(t *testing.T) {
	fm := newFakeMounter()
	h := newHarness(t, func(c *Config) { c.Mounter = fm })
	ctx := t.Context()
	passwd := func(dir string) error {
		if err := os.Mkdir(filepath.Join(dir, "etc"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\nuser:x:1000:1001::/home/user:/bin/sh\n"), 0o644)
	}
	if _, err := h.m.CreateTemplateFrom(ctx, Template{Name: "as-user", Source: "test", Defaults: &Defaults{User: "user"}}, passwd); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.CreateTemplateFrom(ctx, Template{Name: "as-ghost", Source: "test", Defaults: &Defaults{User: "ghost"}}, passwd); err != nil {
		t.Fatal(err)
	}
	ms := []Mount{{Source: "/repo", Target: "/work"}}
	for tmpl, want := range map[string]driver.HostIDs{"as-user": {UID: 1000, GID: 1001}, "tiny": {}} {
		sb, err := h.m.Create(ctx, Spec{Template: tmpl, Mounts: ms})
		if err != nil {
			t.Fatal(err)
		}
		fm.mu.Lock()
		got := fm.opts[sb.ID]
		fm.mu.Unlock()
		if got.User != want || got.Root != (driver.HostIDs{}) {
			t.Errorf("template %s: the Mounter got %+v, want user %+v over root 0:0", tmpl, got, want)
		}
		if err := h.m.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.m.Create(ctx, Spec{Template: "as-ghost", Mounts: ms}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("create with mounts from a template whose user is unknown = %v, want failed_precondition naming it", err)
	}
	h.assertClean(t)
}
