package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
)

func newVolumeHarness(t *testing.T) (*harness, *fakeMounter) {
	fm := newFakeMounter()
	return newHarness(t, func(c *Config) { c.Mounter = fm }), fm
}

func TestVolumeCreateListDelete(t *testing.T) {
	h, _ := newVolumeHarness(t)
	ctx := t.Context()
	v, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "data", Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "data" || v.CreatedAt.IsZero() || v.Labels["team"] != "a" {
		t.Fatalf("created %+v", v)
	}
	for _, tt := range []struct {
		name string
		o    VolumeOptions
		want error
	}{
		{"duplicate", VolumeOptions{Name: "data"}, errdefs.ErrAlreadyExists},
		{"upper case", VolumeOptions{Name: "Data"}, errdefs.ErrInvalidArgument},
		{"too long", VolumeOptions{Name: strings.Repeat("a", 64)}, errdefs.ErrInvalidArgument},
		{"leading dot", VolumeOptions{Name: ".x"}, errdefs.ErrInvalidArgument},
		{"negative size", VolumeOptions{Name: "neg", SizeBytes: -1}, errdefs.ErrInvalidArgument},
		{"size on the fake backend", VolumeOptions{Name: "sized", SizeBytes: 1 << 20}, errdefs.ErrNotImplemented},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := h.m.CreateVolume(ctx, tt.o); !errors.Is(err, tt.want) {
				t.Fatalf("CreateVolume(%+v) = %v, want %v", tt.o, err, tt.want)
			}
		})
	}
	list, err := h.m.Volumes(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "data" {
		t.Fatalf("Volumes = %+v, %v", list, err)
	}
	if recs, _ := h.store.Volumes(ctx); len(recs) != 1 {
		t.Fatalf("store holds %+v", recs)
	}
	if err := h.m.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Volume(ctx, "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Volume after delete = %v, want not_found", err)
	}
	if err := h.m.DeleteVolume(ctx, "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete = %v, want not_found", err)
	}
	if names, _ := h.storage.Volumes(ctx); len(names) != 0 {
		t.Fatalf("storage still holds %v", names)
	}
}

func TestVolumeInUse(t *testing.T) {
	h, fm := newVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "shared"}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 2 {
		sb, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Volume: "shared", Target: "/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		if sb.Mounts[0].Source != "" {
			t.Errorf("the record names the volume's host path %q", sb.Mounts[0].Source)
		}
		if got := fm.prepared[sb.ID][0].Source; got != h.storage.VolumePath("shared") {
			t.Errorf("the Mounter got source %q, want the volume's path", got)
		}
	}
	v, err := h.m.Volume(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string(nil), ids...)
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	if diff := cmp.Diff(want, v.InUseBy); diff != "" {
		t.Errorf("InUseBy (-want +got):\n%s", diff)
	}
	err = h.m.DeleteVolume(ctx, "shared")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), ids[0]) {
		t.Fatalf("delete of a volume in use = %v, want failed_precondition naming %s", err, ids[0])
	}
	for _, id := range ids {
		if err := h.m.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.m.Volume(ctx, "shared"); err != nil {
		t.Fatalf("the volume did not survive its sandboxes: %v", err)
	}
	if err := h.m.DeleteVolume(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	h.assertClean(t)
}

func TestVolumeMissingOnCreate(t *testing.T) {
	h, fm := newVolumeHarness(t)
	for _, ms := range [][]Mount{
		{{Volume: "nope", Target: "/data"}},
		{{Volume: "nope", Source: "/h", Target: "/data"}},
	} {
		_, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: ms})
		if err == nil {
			t.Fatalf("create with %+v succeeded", ms)
		}
		if fm.live() != 0 {
			t.Fatalf("mounts prepared: %v", fm.prepared)
		}
	}
	_, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: []Mount{{Volume: "nope", Target: "/data"}}})
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("create with a missing volume = %v, want not_found naming it", err)
	}
	h.assertClean(t)
}

func TestVolumeFailedPrepareRollsBack(t *testing.T) {
	h, fm := newVolumeHarness(t)
	if _, err := h.m.CreateVolume(t.Context(), VolumeOptions{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	fm.failWith = errdefs.Errorf(errdefs.ErrFailedPrecondition, "cannot map")
	if _, err := h.m.Create(t.Context(), Spec{Template: "tiny", Mounts: []Mount{{Volume: "v", Target: "/v"}}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("create = %v, want the Mounter's error", err)
	}
	h.assertClean(t)
	if v, err := h.m.Volume(t.Context(), "v"); err != nil || len(v.InUseBy) != 0 {
		t.Fatalf("volume after the failed create: %+v, %v", v, err)
	}
}

func TestVolumeFailedRecordLeavesNothing(t *testing.T) {
	h, _ := newVolumeHarness(t)
	h.cfg.Store = failingVolumeStore{h.store}
	h.start(t)
	if _, err := h.m.CreateVolume(t.Context(), VolumeOptions{Name: "v"}); err == nil {
		t.Fatal("create succeeded with a failing store")
	}
	if names, _ := h.storage.Volumes(t.Context()); len(names) != 0 {
		t.Fatalf("storage keeps %v after a failed create", names)
	}
}

type failingVolumeStore struct{ *memStore }

func (failingVolumeStore) PutVolume(context.Context, Volume) error { return errors.New("disk on fire") }

func TestVolumeRestartReconciles(t *testing.T) {
	h, _ := newVolumeHarness(t)
	ctx := t.Context()
	for _, n := range []string{"kept", "gone"} {
		if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.storage.DeleteVolume(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.storage.CreateVolume(ctx, "orphan", storage.VolumeOptions{}); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.start(t)
	list, _ := h.m.Volumes(ctx)
	if len(list) != 1 || list[0].Name != "kept" {
		t.Fatalf("volumes after restart: %+v", list)
	}
	if names, _ := h.storage.Volumes(ctx); !cmp.Equal(names, []string{"kept"}) {
		t.Fatalf("storage after restart: %v", names)
	}
}

func TestVolumeFiles(t *testing.T) {
	h, _ := newVolumeHarness(t)
	ctx := t.Context()
	if _, err := h.m.CreateVolume(ctx, VolumeOptions{Name: "f"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.VolumeWriteFile(ctx, "f", "/a/b/c.txt", strings.NewReader("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, size, err := h.m.VolumeReadFile(ctx, "f", "/a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "hello" || size != 5 {
		t.Fatalf("read %q (%d bytes)", got, size)
	}
	fi, err := h.m.VolumeStat(ctx, "f", "/a/b/c.txt")
	if err != nil || fi.Mode != 0o600 || fi.Type != "file" {
		t.Fatalf("stat %+v, %v", fi, err)
	}
	if os.Geteuid() == 0 && (fi.UID != 0 || fi.GID != 0) {
		t.Errorf("a file written through the API shows as %d:%d, want the sandbox root 0:0", fi.UID, fi.GID)
	}
	if err := h.m.VolumeMkdir(ctx, "f", "/d/e", true, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := h.m.VolumeMkdir(ctx, "f", "/d", false, 0o750); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("mkdir of an existing dir = %v", err)
	}
	list, err := h.m.VolumeList(ctx, "f", "/")
	if err != nil || len(list) != 2 {
		t.Fatalf("list / = %+v, %v", list, err)
	}
	// A symlink a sandbox planted does not lead out of the volume.
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("host"), 0o644)
	os.Symlink(outside, filepath.Join(h.storage.VolumePath("f"), "link"))
	os.Symlink("../../..", filepath.Join(h.storage.VolumePath("f"), "up"))
	for _, p := range []string{"/link", "/up/etc/passwd", "/../../etc/passwd"} {
		rc, _, err := h.m.VolumeReadFile(ctx, "f", p)
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if bytes.Contains(b, []byte("host")) || bytes.Contains(b, []byte("root:")) {
				t.Fatalf("read %s outside the volume: %q", p, b)
			}
		}
	}
	if err := h.m.VolumeWriteFile(ctx, "f", "/link", strings.NewReader("x"), 0o644); err == nil {
		t.Fatal("wrote through a symlink")
	}
	if b, _ := os.ReadFile(outside); string(b) != "host" {
		t.Fatalf("the host file changed: %q", b)
	}
	if err := h.m.VolumeRemove(ctx, "f", "/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.VolumeStat(ctx, "f", "/a/b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat after remove = %v", err)
	}
	if err := h.m.VolumeRemove(ctx, "f", "/"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("remove / = %v", err)
	}
	if _, err := h.m.VolumeStat(ctx, "nope", "/"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat in a missing volume = %v", err)
	}
}
