package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	corral "github.com/corralrun/corral/sdk"
)

// fakeMounter allows the sources beneath root and records what it
// prepares and releases; it touches no file.
type fakeMounter struct {
	root string

	mu       sync.Mutex
	prepared map[string][]sandbox.Mount
	released []string
}

var _ sandbox.Mounter = (*fakeMounter)(nil)

func (f *fakeMounter) Check(ms []sandbox.Mount) error {
	for _, m := range ms {
		if !strings.HasPrefix(m.Source, f.root+"/") {
			return errdefs.Errorf(errdefs.ErrPermissionDenied, "mount source %s: not beneath an allowed directory", m.Source)
		}
	}
	return nil
}

func (f *fakeMounter) Prepare(ctx context.Context, id string, ms []sandbox.Mount, _ sandbox.MountOptions) ([]driver.Mount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.prepared == nil {
		f.prepared = map[string][]sandbox.Mount{}
	}
	f.prepared[id] = ms
	out := make([]driver.Mount, len(ms))
	for i, m := range ms {
		out[i] = driver.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.Mode == sandbox.MountReadOnly}
	}
	return out, nil
}

func (f *fakeMounter) Release(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, id)
	return nil
}

func (f *fakeMounter) Sweep(ctx context.Context, keep func(id string) bool) error { return nil }

// state returns what was prepared for id and whether id was released.
func (f *fakeMounter) state(id string) ([]sandbox.Mount, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.released {
		if r == id {
			return f.prepared[id], true
		}
	}
	return f.prepared[id], false
}

func TestCreateWithMounts(t *testing.T) {
	fm := &fakeMounter{root: "/srv/allowed"}
	c, ts := newTestServer(t, "", func(cfg *sandbox.Config) { cfg.Mounter = fm })
	_, bare := newTestServer(t, "")
	tests := []struct {
		name   string
		url    string
		mounts string
		status int
		code   string
	}{
		{"bad mode", ts.URL, `[{"source":"/srv/allowed/a","target":"/work","mode":"rwx"}]`, 400, "invalid_argument"},
		{"unknown field", ts.URL, `[{"source":"/srv/allowed/a","target":"/work","readonly":true}]`, 400, "invalid_argument"},
		{"relative target", ts.URL, `[{"source":"/srv/allowed/a","target":"work"}]`, 400, "invalid_argument"},
		{"outside the allowed directory", ts.URL, `[{"source":"/etc","target":"/work"}]`, 403, "permission_denied"},
		{"no mounter", bare.URL, `[{"source":"/srv/allowed/a","target":"/work"}]`, 403, "permission_denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"template":"bb","mounts":` + tt.mounts + `}`
			resp, b := send(t, http.MethodPost, tt.url+"/v1/sandboxes", body)
			if resp.StatusCode != tt.status || !strings.Contains(string(b), `"code":"`+tt.code+`"`) {
				t.Fatalf("status %d body %s; want %d %s", resp.StatusCode, b, tt.status, tt.code)
			}
		})
	}

	ctx := t.Context()
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb", Mounts: []corral.Mount{
		{Source: "/srv/allowed/src/lib", Target: "/opt/lib", Mode: corral.MountReadOnly},
		{Source: "/srv/allowed/src", Target: "/work"},
		{Source: "/srv/allowed/cache", Target: "/cache", Mode: corral.MountCopyOnWrite},
	}})
	if err != nil {
		t.Fatal(err)
	}
	// Shallower targets first, the default mode named.
	want := []corral.Mount{
		{Source: "/srv/allowed/src", Target: "/work", Mode: "rw"},
		{Source: "/srv/allowed/cache", Target: "/cache", Mode: "cow"},
		{Source: "/srv/allowed/src/lib", Target: "/opt/lib", Mode: "ro"},
	}
	if diff := cmp.Diff(want, sb.Mounts); diff != "" {
		t.Fatalf("created sandbox's mounts (-want +got):\n%s", diff)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got.Mounts); diff != "" {
		t.Fatalf("mounts read back (-want +got):\n%s", diff)
	}
	if prepared, released := fm.state(sb.ID); len(prepared) != len(want) || released {
		t.Fatalf("mounter: prepared %v, released %v; want %d mounts prepared, none released", prepared, released, len(want))
	}
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, released := fm.state(sb.ID); !released {
		t.Fatal("delete did not release the sandbox's mounts")
	}
}

func TestRunWithMounts(t *testing.T) {
	fm := &fakeMounter{root: "/srv/allowed"}
	c, _ := newTestServer(t, "", func(cfg *sandbox.Config) { cfg.Mounter = fm })
	mounts := []corral.Mount{{Source: "/srv/allowed/a", Target: "/work", Mode: corral.MountReadOnly}}
	sb, res, err := c.Run(t.Context(), corral.RunOptions{Sandbox: corral.CreateOptions{Template: "bb", Mounts: mounts},
		Exec: corral.ExecOptions{Cmd: []string{"true"}}, Remove: true})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run: %+v %v", res, err)
	}
	if diff := cmp.Diff(mounts, sb.Mounts); diff != "" {
		t.Fatalf("run's sandbox event mounts (-want +got):\n%s", diff)
	}
	if _, released := fm.state(sb.ID); !released {
		t.Fatal("run --rm did not release the sandbox's mounts")
	}
	_, _, err = c.Run(t.Context(), corral.RunOptions{Sandbox: corral.CreateOptions{Template: "bb",
		Mounts: []corral.Mount{{Source: "/srv/allowed/a", Target: "/proc/x"}}}, Exec: corral.ExecOptions{Cmd: []string{"true"}}})
	if corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("run with a mount over /proc: %v", err)
	}
}

// TestMountViewJSON keeps the view's shape: a sandbox without mounts has
// no "mounts" field.
func TestMountViewJSON(t *testing.T) {
	b, err := json.Marshal(viewOf(sandbox.Sandbox{ID: "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "mounts") {
		t.Fatalf("view without mounts: %s", b)
	}
}
