package e2b

import (
	"context"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/sandbox"
)

// bindMounter is a sandbox.Mounter that hands every source to the driver
// as it is: the fake driver only records mounts.
type bindMounter struct{}

func (bindMounter) Check([]sandbox.Mount) error { return nil }

func (bindMounter) Prepare(_ context.Context, _ string, ms []sandbox.Mount, _ sandbox.MountOptions) ([]driver.Mount, error) {
	out := make([]driver.Mount, len(ms))
	for i, mt := range ms {
		out[i] = driver.Mount{Source: mt.Source, Target: mt.Target, ReadOnly: mt.Mode == sandbox.MountReadOnly}
	}
	return out, nil
}

func (bindMounter) Release(context.Context, string) error { return nil }

func (bindMounter) Sweep(context.Context, func(string) bool) error { return nil }

// TestSnapshotAndForkShareVolumes snapshots and forks a sandbox made with
// volumeMounts through E2B's API, which has no say in what happens to the
// volumes: the snapshot's sandboxes and the copies mount the same volume.
func TestSnapshotAndForkShareVolumes(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.m.CreateVolume(ctx, sandbox.VolumeOptions{Name: "data"}); err != nil {
		t.Fatal(err)
	}
	var created map[string]any
	if code := e.api("POST", "/sandboxes", `{"templateID":"bb","timeout":60,"volumeMounts":[{"name":"data","path":"/data"}]}`, &created); code != 201 {
		t.Fatalf("create with volumeMounts: %d %v", code, created)
	}
	src := created["sandboxID"].(string)
	var snap map[string]any
	if code := e.api("POST", "/sandboxes/"+src+"/snapshots", `{"name":"vol-snap"}`, &snap); code != 201 {
		t.Fatalf("snapshot of a sandbox with volumeMounts: %d %v", code, snap)
	}
	created = nil
	if code := e.api("POST", "/sandboxes", `{"templateID":"vol-snap","timeout":60}`, &created); code != 201 {
		t.Fatalf("create from the snapshot: %d %v", code, created)
	}
	var forks []map[string]any
	if code := e.api("POST", "/sandboxes/"+src+"/fork", `{"count":1}`, &forks); code != 201 || len(forks) != 1 {
		t.Fatalf("fork of a sandbox with volumeMounts: %d %v", code, forks)
	}
	fork := forks[0]["sandbox"].(map[string]any)["sandboxID"].(string)
	for _, id := range []string{created["sandboxID"].(string), fork} {
		sb, err := e.m.Get(context.Background(), id)
		if err != nil || len(sb.Mounts) != 1 || sb.Mounts[0].Volume != "data" {
			t.Errorf("sandbox %s mounts %+v (%v), want volume data", id, sb.Mounts, err)
		}
	}
	if vols, err := e.m.Volumes(ctx); err != nil || len(vols) != 1 {
		t.Errorf("volumes %+v (%v): want data alone", vols, err)
	}
}
