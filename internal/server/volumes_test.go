package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/sandbox"
	corral "github.com/corralrun/corral/sdk"
)

func TestVolumesOverHTTP(t *testing.T) {
	fm := &fakeMounter{root: "/srv/allowed"}
	c, ts := newTestServer(t, "", func(cfg *sandbox.Config) { cfg.Mounter = fm })
	ctx := t.Context()
	v, err := c.CreateVolume(ctx, "data", corral.VolumeOptions{Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "data" || v.Labels["k"] != "v" || v.CreatedAt.IsZero() {
		t.Fatalf("created %+v", v)
	}
	for _, tt := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"duplicate", "POST", "/v1/volumes", `{"name":"data"}`, 409, "already_exists"},
		{"bad name", "POST", "/v1/volumes", `{"name":"Bad/Name"}`, 400, "invalid_argument"},
		{"size on fake storage", "POST", "/v1/volumes", `{"name":"big","size_bytes":1048576}`, 501, "not_implemented"},
		{"negative size", "POST", "/v1/volumes", `{"name":"neg","size_bytes":-1}`, 400, "invalid_argument"},
		{"unknown field", "POST", "/v1/volumes", `{"name":"x","size":1}`, 400, "invalid_argument"},
		{"missing", "GET", "/v1/volumes/nope", "", 404, "not_found"},
		{"file without path", "GET", "/v1/volumes/data/files", "", 400, "invalid_argument"},
		{"mount a missing volume", "POST", "/v1/sandboxes", `{"template":"bb","mounts":[{"volume":"nope","target":"/d"}]}`, 404, "not_found"},
		{"source and volume", "POST", "/v1/sandboxes", `{"template":"bb","mounts":[{"volume":"data","source":"/srv/allowed/a","target":"/d"}]}`, 400, "invalid_argument"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := send(t, tt.method, ts.URL+tt.path, tt.body)
			if resp.StatusCode != tt.status || !strings.Contains(string(b), `"code":"`+tt.code+`"`) {
				t.Fatalf("status %d body %s; want %d %s", resp.StatusCode, b, tt.status, tt.code)
			}
		})
	}

	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb", Mounts: []corral.Mount{{Volume: "data", Target: "/data", Mode: corral.MountReadOnly}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Mounts) != 1 || sb.Mounts[0] != (corral.Mount{Volume: "data", Target: "/data", Mode: "ro"}) {
		t.Fatalf("sandbox mounts %+v", sb.Mounts)
	}
	if v, err := c.Volume(ctx, "data"); err != nil || len(v.InUseBy) != 1 || v.InUseBy[0] != sb.ID {
		t.Fatalf("volume in use: %+v, %v", v, err)
	}
	if err := c.DeleteVolume(ctx, "data"); corral.ErrorCode(err) != corral.CodeFailedPrecondition || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("delete in use = %v, want failed_precondition naming %s", err, sb.ID)
	}

	if _, err := c.VolumeWriteFile(ctx, "data", "/dir/f.txt", strings.NewReader("hi"), 0o640); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.VolumeStat(ctx, "data", "/dir/f.txt"); err != nil || fi.Size != 2 || fi.Mode != 0o640 {
		t.Fatalf("stat %+v, %v", fi, err)
	}
	rc, err := c.VolumeReadFile(ctx, "data", "/dir/f.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hi" {
		t.Fatalf("read %q", b)
	}
	if _, err := c.VolumeMkdir(ctx, "data", "/x/y", true); err != nil {
		t.Fatal(err)
	}
	list, err := c.VolumeListDir(ctx, "data", "/")
	if err != nil || len(list) != 2 {
		t.Fatalf("list %+v, %v", list, err)
	}
	if err := c.VolumeRemove(ctx, "data", "/dir"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VolumeStat(ctx, "data", "/dir"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("stat after remove = %v", err)
	}
	if _, err := c.VolumeReadFile(ctx, "data", "/../../etc/passwd"); err == nil {
		// Clean paths stay in the volume: this names /etc/passwd in it.
		t.Fatal("read a file the volume does not have")
	}

	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	vs, err := c.Volumes(ctx)
	if err != nil || len(vs) != 1 || len(vs[0].InUseBy) != 0 {
		t.Fatalf("volumes after the sandbox went: %+v, %v", vs, err)
	}
	if err := c.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	resp, _ := send(t, http.MethodDelete, ts.URL+"/v1/volumes/data", "")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("second delete: %d", resp.StatusCode)
	}
}
