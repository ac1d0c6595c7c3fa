package mounts

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/sandbox"
)

// TestReadWriteMapsTheOwnerToTheUser prepares a rw mount for a sandbox
// whose default user is not root, in a range of its own above the stored
// one: the owner's files show as that user's, the user's writes land as
// the owner's, and the root's as the stored root's.
func TestReadWriteMapsTheOwnerToTheUser(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1001)
	// The test's sandbox root has no capabilities to override the mode.
	if err := os.Chmod(repo, 0o777); err != nil {
		t.Fatal(err)
	}
	root := driver.HostIDs{UID: driver.StoredIDBase + driver.StoredIDSize, GID: driver.StoredIDBase + driver.StoredIDSize}
	user := driver.HostIDs{UID: root.UID + 1000, GID: root.GID + 1000}
	dm, err := e.m.Prepare(context.Background(), "user1", []sandbox.Mount{{Source: repo, Target: "/w", Mode: sandbox.MountReadWrite}}, sandbox.MountOptions{Root: root, User: user})
	if err != nil {
		t.Fatal(err)
	}
	checkOwner(t, filepath.Join(dm[0].Source, "hello"), user)
	runAs(t, user, dm[0].Source, `echo user > byuser && mkdir userdir`)
	runAs(t, root, dm[0].Source, `echo root > byroot`)
	checkOwner(t, filepath.Join(dm[0].Source, "byroot"), root)
	for name, want := range map[string]driver.HostIDs{
		"byuser":  {UID: 1000, GID: 1001},
		"userdir": {UID: 1000, GID: 1001},
		"byroot":  {UID: driver.StoredIDBase, GID: driver.StoredIDBase},
	} {
		checkOwner(t, filepath.Join(repo, name), want)
	}
	e.release(t, "user1")
}

func checkOwner(t *testing.T, name string, want driver.HostIDs) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(name, &st); err != nil {
		t.Fatal(err)
	}
	if got := (driver.HostIDs{UID: st.Uid, GID: st.Gid}); got != want {
		t.Errorf("%s is owned by %d:%d, want %d:%d", name, got.UID, got.GID, want.UID, want.GID)
	}
}

// TestIDMapWithoutPath makes an ID-mapped mount with an empty PATH: the
// namespace for the mapping needs no program from it.
func TestIDMapWithoutPath(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	t.Setenv("PATH", "")
	dm := e.prepare(t, "nopath1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadOnly})
	checkOwner(t, filepath.Join(dm[0].Source, "hello"), sandboxRoot)
	e.release(t, "nopath1")
}

// TestIDMapReexec makes the mapping's namespace the slow way, by
// re-executing the (test) binary, as where the holder program cannot run.
func TestIDMapReexec(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	e.m.ids.holder.Close()
	e.m.ids.holder = nil
	dm := e.prepare(t, "reexec1", sandbox.Mount{Source: repo, Target: "/w", Mode: sandbox.MountReadOnly})
	checkOwner(t, filepath.Join(dm[0].Source, "hello"), sandboxRoot)
	e.release(t, "reexec1")
}

// TestCopyOnWriteInLayerDir prepares a cow mount whose layer goes to a
// directory the storage names: the writes land there, Changes finds them,
// and Release removes the layer and its link.
func TestCopyOnWriteInLayerDir(t *testing.T) {
	e := newEnv(t)
	repo := e.dir(t, "repo", 1000, 1000)
	layers := filepath.Join(t.TempDir(), "layers")
	if err := os.Mkdir(layers, 0o700); err != nil {
		t.Fatal(err)
	}
	dm, err := e.m.Prepare(context.Background(), "layer1", []sandbox.Mount{{Source: repo, Target: "/w", Mode: sandbox.MountCopyOnWrite}},
		sandbox.MountOptions{Root: sandboxRoot, User: sandboxRoot, LayerDir: layers})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dm[0].Source, "new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(layers, "0", "upper", "new")); err != nil {
		t.Fatalf("the write is not in the layer directory: %v", err)
	}
	changes, err := e.m.Changes("layer1", 0, "/w")
	if err != nil || len(changes) != 1 || changes[0] != (sandbox.Change{Path: "/w/new", Kind: sandbox.ChangeAdded}) {
		t.Fatalf("Changes = %v, %v; want /w/new added", changes, err)
	}
	e.release(t, "layer1")
	if ents, err := os.ReadDir(layers); err != nil || len(ents) != 0 {
		t.Fatalf("the layer directory holds %v after release (%v)", ents, err)
	}
	if _, err := os.Stat(filepath.Join(repo, "new")); !os.IsNotExist(err) {
		t.Fatalf("the write reached the host directory: %v", err)
	}
}
