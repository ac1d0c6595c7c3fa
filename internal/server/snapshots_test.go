package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

func TestSnapshotsOverHTTP(t *testing.T) {
	c, ts := newTestServer(t, "")
	ctx := t.Context()
	v, err := c.Version(ctx)
	if err != nil || v.Runtimes[0].Snapshot != corral.SnapshotFilesystem {
		t.Fatalf("runtimes: %v %+v", err, v)
	}
	sb, err := c.Create(ctx, corral.CreateOptions{Template: "bb", Metadata: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := c.Pause(ctx, sb.ID); err != nil || p.State != "paused" {
		t.Fatalf("pause: %v %+v", err, p)
	}
	if _, err := c.Pause(ctx, sb.ID); corral.ErrorCode(err) != "failed_precondition" {
		t.Fatalf("pause twice: %v", err)
	}
	if _, err := c.Resume(ctx, sb.ID, corral.Timeout(-time.Second)); corral.ErrorCode(err) != "invalid_argument" {
		t.Fatalf("resume with a negative timeout: %v", err)
	}
	r, err := c.Resume(ctx, sb.ID, corral.Timeout(time.Hour))
	if err != nil || r.State != "running" || r.Deadline == nil || time.Until(*r.Deadline) < 59*time.Minute {
		t.Fatalf("resume: %v %+v", err, r)
	}
	// Resume without a body: the server default timeout.
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(ts.URL+"/v1/sandboxes/"+sb.ID+"/resume", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("resume without a body: %v %v", err, resp.Status)
	}
	resp.Body.Close()

	snap, err := c.CreateSnapshot(ctx, sb.ID, "s1", map[string]string{"k": "v"})
	if err != nil || snap.Kind != corral.SnapshotFilesystem || snap.SandboxID != sb.ID || snap.Metadata["k"] != "v" || snap.Template != "bb" {
		t.Fatalf("snapshot: %v %+v", err, snap)
	}
	for _, tc := range []struct {
		name, code string
		err        error
	}{
		{"bad name", "invalid_argument", func() error { _, err := c.CreateSnapshot(ctx, sb.ID, "Bad Name", nil); return err }()},
		{"duplicate", "already_exists", func() error { _, err := c.CreateSnapshot(ctx, sb.ID, "s1", nil); return err }()},
		{"unknown sandbox", "not_found", func() error { _, err := c.CreateSnapshot(ctx, "nope", "s2", nil); return err }()},
		{"unknown snapshot", "not_found", func() error { _, err := c.GetSnapshot(ctx, "nope"); return err }()},
		{"create from unknown", "not_found", func() error {
			_, err := c.Create(ctx, corral.CreateOptions{FromSnapshot: "nope"})
			return err
		}()},
		{"fork zero", "invalid_argument", func() error { _, err := c.Fork(ctx, sb.ID, 0); return err }()},
		{"fork too many", "invalid_argument", func() error { _, err := c.Fork(ctx, sb.ID, 17); return err }()},
		{"template from unknown", "not_found", func() error { _, err := c.TemplateFromSnapshot(ctx, "t2", "nope"); return err }()},
		{"template in use", "failed_precondition", c.DeleteTemplate(ctx, "bb")},
	} {
		if got := corral.ErrorCode(tc.err); got != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, tc.err, tc.code)
		}
	}
	list, err := c.Snapshots(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "s1" {
		t.Fatalf("list: %v %+v", err, list)
	}
	from, err := c.Create(ctx, corral.CreateOptions{FromSnapshot: "s1"})
	if err != nil || from.Template != "bb" {
		t.Fatalf("create from snapshot: %v %+v", err, from)
	}
	copies, err := c.Fork(ctx, sb.ID, 2)
	if err != nil || len(copies) != 2 || copies[0].Metadata["team"] != "a" {
		t.Fatalf("fork: %v %+v", err, copies)
	}
	if tpl, err := c.TemplateFromSnapshot(ctx, "t2", "s1"); err != nil || !strings.HasPrefix(tpl.Source, "snapshot") {
		t.Fatalf("template from snapshot: %v %+v", err, tpl)
	}
	if err := c.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, "s1"); corral.ErrorCode(err) != "not_found" {
		t.Fatalf("delete twice: %v", err)
	}
}
