package btrfs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/testutil"
)

// openModeBackend opens a backend in quota mode on a fresh image, with
// the test's usual Close and leak check, logging into log when set.
func openModeBackend(t testing.TB, mode string, log *testutil.SyncBuffer) *Backend {
	t.Helper()
	requirements(t)
	dir := t.TempDir()
	var w interface{ Write([]byte) (int, error) } = t.Output()
	if log != nil {
		w = log
	}
	b, err := New(t.Context(), Config{Dir: dir, QuotaMode: mode, QuotaCheckInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(w, nil))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { closeAndCheck(t, b, dir) })
	return b
}

// Sandboxes come and go in bursts while others keep a disk limit: the
// accounting must stay consistent while the deleted roots' qgroups go, and
// the limit must hold afterwards.
func TestDiskLimitHoldsThroughChurn(t *testing.T) {
	const (
		limit  = 16 << 20
		bursts = 2
		burst  = 40
	)
	for _, mode := range []string{QuotaSimple, QuotaFull} {
		t.Run(mode, func(t *testing.T) {
			b := openModeBackend(t, mode, nil)
			must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
			victim, err := b.CreateRoot(t.Context(), "victim", "base", storage.RootOptions{DiskBytes: limit})
			must(t, err)
			t.Cleanup(func() { must(t, b.DeleteRoot(t.Context(), "victim")) })
			if got := b.QuotaStatus().Mode; got != mode {
				t.Fatalf("quota mode %q, want %q", got, mode)
			}

			for i := range bursts {
				var wg sync.WaitGroup
				errc := make(chan error, burst)
				for j := range burst {
					wg.Go(func() {
						id := fmt.Sprintf("r%d-%d", i, j)
						opts := storage.RootOptions{}
						if j%2 == 0 {
							opts.DiskBytes = 8 << 20
						}
						root, err := b.CreateRoot(t.Context(), id, "base", opts)
						if err == nil {
							err = churnWrites(root, j)
						}
						errc <- errors.Join(err, b.DeleteRoot(t.Context(), id))
					})
				}
				wg.Wait()
				close(errc)
				for err := range errc {
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			// Let the cleaner drop the deleted subvolumes and the watcher
			// remove their qgroups, which is when a qgroup removed too
			// early would corrupt full accounting.
			waitReleased(t, b)
			if s := b.QuotaStatus(); !s.Consistent || s.Inconsistencies != 0 {
				t.Fatalf("after %d bursts of %d roots: %+v", bursts, burst, s)
			}

			n, err := fillUntil(filepath.Join(victim, "fill"), 4*limit)
			if !errors.Is(err, unix.EDQUOT) {
				t.Errorf("filling a root limited to %d bytes: wrote %d, err %v; want EDQUOT", limit, n, err)
			}
			// Metadata counts too, so the data stops a little short.
			if n > limit {
				t.Errorf("wrote %d bytes into a root limited to %d", n, limit)
			}
			t.Logf("%s quotas: a root limited to %d MiB took %d MiB after %d bursts of %d roots", mode, limit>>20, n>>20, bursts, burst)
		})
	}
}

// waitReleased waits until the watcher has removed every deleted root's
// qgroup, for up to a minute: the cleaner drops subvolumes in the
// background, slower on a busy machine.
func waitReleased(t *testing.T, b *Backend) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); b.releasing() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d qgroups of deleted roots still not removed after a minute", b.releasing())
		}
	}
}

// churnWrites writes what a short-lived sandbox might: a file of a few
// MiB and a directory of small files.
func churnWrites(root string, seed int) error {
	if _, err := fillUntil(filepath.Join(root, "data"), int64(1+seed%4)<<20); err != nil {
		return err
	}
	dir := filepath.Join(root, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	for k := range 200 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(k)), []byte(strings.Repeat("x", k)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// While the accounting is inconsistent, no limit is enforced: the backend
// says so, refuses roots that ask for one, rescans, and takes them again
// once the rescan has made the accounting right.
func TestInconsistentQuotaRefusesLimitedRoots(t *testing.T) {
	btrfsCLI := testutil.RequiresBinary(t, "btrfs")
	log := &testutil.SyncBuffer{}
	b := openModeBackend(t, QuotaFull, log)
	// The test plays the watcher, so that no rescan can repair the
	// accounting before the refusal is checked.
	b.closeQuota()
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	if _, err := b.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { must(t, b.DeleteRoot(t.Context(), "limited")) })

	// Assigning a qgroup that shares extents to a parent without a rescan
	// leaves full accounting inconsistent, a state the kernel reaches by
	// itself in the ways quota.go describes.
	scratch, err := b.ScratchDir("qgroup-test")
	must(t, err)
	must(t, subvolCreateAt(scratch, "a"))
	_, err = fillUntil(filepath.Join(scratch, "a", "data"), 1<<20)
	must(t, err)
	must(t, snapshotAt(filepath.Join(scratch, "a"), scratch, "b", 0))
	t.Cleanup(func() {
		must(t, deleteSubvol(scratch, "b"))
		must(t, deleteSubvol(scratch, "a"))
	})
	fd, err := openDir(b.base)
	must(t, err)
	must(t, syncFS(fd))
	unix.Close(fd)
	a := subvolIDOf(t, filepath.Join(scratch, "a"))
	for _, args := range [][]string{
		{"qgroup", "create", "1/100", b.base},
		{"qgroup", "assign", "--no-rescan", fmt.Sprintf("0/%d", a), "1/100", b.base},
	} {
		if out, err := exec.CommandContext(t.Context(), btrfsCLI, args...).CombinedOutput(); err != nil {
			t.Fatalf("btrfs %v: %v\n%s", args, err, out)
		}
	}

	// The refusal does not wait for the watcher: a create reads the flag.
	_, err = b.CreateRoot(t.Context(), "refused", "base", storage.RootOptions{DiskBytes: 8 << 20})
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.RetryAfter(err) <= 0 {
		t.Errorf("CreateRoot with a limit while inconsistent: %v (retry after %v), want ErrUnavailable with a retry hint",
			err, errdefs.RetryAfter(err))
	}
	if err == nil {
		must(t, b.DeleteRoot(t.Context(), "refused"))
	}
	// A root without a limit loses nothing and is still made.
	if _, err := b.CreateRoot(t.Context(), "plain", "base", storage.RootOptions{}); err != nil {
		t.Errorf("CreateRoot without a limit while inconsistent: %v", err)
	} else {
		must(t, b.DeleteRoot(t.Context(), "plain"))
	}

	testutil.WaitFor(t, b.checkQuota)
	if s := b.QuotaStatus(); s.Inconsistencies != 1 || s.Mode != QuotaFull {
		t.Errorf("status after the rescan: %+v, want one inconsistency in full mode", s)
	}
	for _, want := range []string{"level=ERROR msg=\"btrfs quota accounting is inconsistent", "msg=\"rescanning btrfs quotas\"", "consistent again"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	if _, err := b.CreateRoot(t.Context(), "again", "base", storage.RootOptions{DiskBytes: 8 << 20}); err != nil {
		t.Errorf("CreateRoot with a limit after the rescan: %v", err)
	} else {
		must(t, b.DeleteRoot(t.Context(), "again"))
	}
}

// Quotas that an older daemon enabled with full accounting become simple
// quotas at the next start, and the roots keep their limits.
func TestFullQuotasSwitchToSimple(t *testing.T) {
	requirements(t)
	dir := t.TempDir()
	b1, err := New(t.Context(), Config{Dir: dir, QuotaMode: QuotaFull})
	must(t, err)
	must(t, b1.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	root, err := b1.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: 4 << 20})
	must(t, err)
	if got := b1.QuotaStatus().Mode; got != QuotaFull {
		t.Fatalf("first backend's mode %q, want full", got)
	}
	b1.closeQuota() // a daemon that stopped without unmounting

	b2 := openTestBackend(t, dir)
	t.Cleanup(func() { b1.Close() })
	if s := b2.QuotaStatus(); s.Mode != QuotaSimple || !s.Consistent {
		t.Fatalf("after reopening: %+v, want consistent simple quotas", s)
	}
	id := subvolIDOf(t, filepath.Join(b2.rootsDir(), "limited"))
	if got, _ := b2.qgroupValue(id, "max_exclusive"); got != 4<<20 {
		t.Errorf("limit after the switch: %d, want %d", got, 4<<20)
	}
	n, err := fillUntil(filepath.Join(root, "fill"), 16<<20)
	if !errors.Is(err, unix.EDQUOT) || n > 4<<20 {
		t.Errorf("filling the root after the switch: wrote %d, err %v; want EDQUOT within %d bytes", n, err, 4<<20)
	}
	must(t, b2.DeleteRoot(t.Context(), "limited"))
}

func TestUnknownQuotaMode(t *testing.T) {
	requirements(t)
	dir := t.TempDir()
	_, err := New(t.Context(), Config{Dir: dir, QuotaMode: "exact"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("New with quota mode \"exact\": %v, want ErrInvalidArgument", err)
	}
	if m := testutil.Mounts(t, dir); len(m) > 0 {
		t.Errorf("mounts left by a refused New: %v", m)
	}
}

// A backend opened on a filesystem whose quotas are on deletes spares of
// an older floor at once, before its watcher runs; their qgroups still go.
func TestReopenWithQuotasDropsStaleSpares(t *testing.T) {
	b, dir := newTestBackend(t)
	must(t, b.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	if _, err := b.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	must(t, b.DeleteRoot(t.Context(), "limited"))
	must(t, snapshotAt(b.seedDir(), b.sparesDir(), "1-00000000", 0))
	stale := subvolIDOf(t, filepath.Join(b.sparesDir(), "1-00000000"))
	must(t, b.Close())

	b2 := openTestBackend(t, dir)
	if _, err := os.Lstat(filepath.Join(b2.sparesDir(), "1-00000000")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale spare survived New: %v", err)
	}
	waitQgroupGone(t, b2, stale)
}

// A crash in the middle of the switch to simple quotas, after quotas went
// off and before the limits were back, loses no limit: the next start
// puts back the ones recorded.
func TestSwitchInterruptedRestoresLimits(t *testing.T) {
	requirements(t)
	dir := t.TempDir()
	b1, err := New(t.Context(), Config{Dir: dir, QuotaMode: QuotaFull})
	must(t, err)
	t.Cleanup(func() { b1.Close() })
	must(t, b1.CreateTemplate(t.Context(), "base", writeFile("f", "1")))
	_, err = b1.CreateRoot(t.Context(), "limited", "base", storage.RootOptions{DiskBytes: 4 << 20})
	must(t, err)
	b1.closeQuota()
	limits, err := b1.rootLimits()
	must(t, err)
	must(t, writeLimits(b1.limitsFile(), limits))
	fd, err := openDir(b1.base)
	must(t, err)
	must(t, disableQuota(fd))
	unix.Close(fd)

	b2 := openTestBackend(t, dir)
	id := subvolIDOf(t, filepath.Join(b2.rootsDir(), "limited"))
	if got, _ := b2.qgroupValue(id, "max_exclusive"); got != 4<<20 {
		t.Errorf("limit after the interrupted switch: %d, want %d", got, 4<<20)
	}
	if s := b2.QuotaStatus(); s.Mode != QuotaSimple {
		t.Errorf("mode after the interrupted switch: %+v, want simple", s)
	}
	if _, err := os.Stat(b2.limitsFile()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record of the limits left behind: %v", err)
	}
	must(t, b2.DeleteRoot(t.Context(), "limited"))
}
