package sandbox

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/fake"
)

// reservingDriver is the fake driver with driver.IDReserver: it records
// the sandboxes it reserved IDs for and the deletes it saw.
type reservingDriver struct {
	*fake.Driver
	mu                sync.Mutex
	reserved, deleted []string
}

func (d *reservingDriver) ReserveIDs(ctx context.Context, id, template string) (*os.File, error) {
	d.mu.Lock()
	d.reserved = append(d.reserved, id)
	d.mu.Unlock()
	return os.Open(os.DevNull)
}

func (d *reservingDriver) Delete(ctx context.Context, id string) error {
	d.mu.Lock()
	d.deleted = append(d.deleted, id)
	d.mu.Unlock()
	return d.Driver.Delete(ctx, id)
}

// TestCreateReservesIDs: a create reserves host IDs before the root, and
// a create whose root fails releases them.
func TestCreateReservesIDs(t *testing.T) {
	var rd *reservingDriver
	h := newHarness(t, func(c *Config) {
		rd = &reservingDriver{Driver: c.Drivers[0].(*fake.Driver)}
		c.Drivers = []driver.Driver{rd}
	})
	sb, err := h.m.Create(t.Context(), Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rd.reserved, sb.ID) {
		t.Errorf("no IDs reserved for %s: %v", sb.ID, rd.reserved)
	}
	boom := errors.New("no root")
	h.storage.SetFailCreateRoot(func(string) error { return boom })
	if _, err := h.m.Create(t.Context(), Spec{Template: "tiny"}); !errors.Is(err, boom) {
		t.Fatalf("create with a failing root: %v", err)
	}
	failed := rd.reserved[len(rd.reserved)-1]
	if !slices.Contains(rd.deleted, failed) {
		t.Errorf("IDs of the failed create %s not released: deletes %v", failed, rd.deleted)
	}
}

// TestStartReservesIDsAgain: a start reserves host IDs again, since the
// stop released them with the instance, and a start that fails after the
// reservation (its mounts) releases them.
func TestStartReservesIDsAgain(t *testing.T) {
	var rd *reservingDriver
	fm := newFakeMounter()
	h := newHarness(t, func(c *Config) {
		rd = &reservingDriver{Driver: c.Drivers[0].(*fake.Driver)}
		c.Drivers = []driver.Driver{rd}
		c.Mounter = fm
	})
	ctx := t.Context()
	sb, err := h.m.Create(ctx, Spec{Template: "tiny", Mounts: []Mount{{Source: "/repo", Target: "/work", Mode: MountCopyOnWrite}}})
	if err != nil {
		t.Fatal(err)
	}
	h.mustStop(t, sb.ID)
	count := func(ids []string) int {
		rd.mu.Lock()
		defer rd.mu.Unlock()
		n := 0
		for _, id := range ids {
			if id == sb.ID {
				n++
			}
		}
		return n
	}
	deletes := count(rd.deleted)
	fm.mu.Lock()
	fm.failWith = errors.New("source gone")
	fm.mu.Unlock()
	if _, err := h.m.StartSandbox(ctx, sb.ID); err == nil {
		t.Fatal("start with failing mounts succeeded")
	}
	if got := count(rd.reserved); got != 2 {
		t.Fatalf("IDs reserved %d times for %s, want 2 (create, start)", got, sb.ID)
	}
	if count(rd.deleted) <= deletes {
		t.Fatalf("the failed start did not release the IDs it reserved: deletes %v", rd.deleted)
	}
	h.checkStopped(t, sb.ID)
	fm.mu.Lock()
	fm.failWith = nil
	fm.mu.Unlock()
	if _, err := h.m.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := count(rd.reserved); got != 3 {
		t.Fatalf("IDs reserved %d times, want 3", got)
	}
	if err := h.m.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
