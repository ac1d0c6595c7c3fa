package e2e

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// The reproduction of disk limits switching off: a sandbox with a disk
// limit lives through bursts of creates and deletes, some with limits of
// their own; afterwards the daemon reports consistent accounting and the
// first sandbox still cannot write past its limit, neither through the
// file API nor from inside.
func TestDiskLimitHoldsThroughChurn(t *testing.T) {
	const (
		limitMB = 32
		bursts  = 2
		burst   = 40
		workers = 8
	)
	d := startDaemon(t, "btrfs")
	victim := d.create(t, corral.CreateOptions{DiskMB: limitMB})

	for i := range bursts {
		ids := make(chan int)
		errc := make(chan error, burst)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for j := range ids {
					errc <- churnOne(t, d, j)
				}
			})
		}
		for j := range burst {
			ids <- j
		}
		close(ids)
		wg.Wait()
		close(errc)
		for err := range errc {
			if err != nil {
				t.Fatalf("burst %d: %v\nlogs:\n%s", i, err, d.Logs())
			}
		}
	}

	// The deleted sandboxes' qgroups go once the kernel has given their
	// bytes back, which is when one removed too early would corrupt
	// full accounting.
	var h *corral.Health
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if h, err = d.Client.Health(t.Context()); err != nil {
			t.Fatal(err)
		}
		if h.DiskQuota == nil || h.DiskQuota.Releasing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d deleted sandboxes' qgroups still not removed after a minute", h.DiskQuota.Releasing)
		}
	}
	if !h.OK || h.DiskQuota == nil || !h.DiskQuota.Enabled || !h.DiskQuota.Consistent || h.DiskQuota.Inconsistencies != 0 {
		t.Fatalf("health after %d bursts of %d: %+v (disk quota %+v)", bursts, burst, h, h.DiskQuota)
	}
	if h.DiskQuota.Mode != "simple" {
		t.Errorf("disk quota mode %q, want simple on this kernel", h.DiskQuota.Mode)
	}

	// Through the file API: a 2x-limit upload must fail, and not as
	// "busy".
	big := io.LimitReader(zeros{}, 2*limitMB<<20)
	_, err := d.Client.WriteFile(t.Context(), victim.ID, "/fill-api", big, 0o644)
	if err == nil {
		t.Errorf("uploading %d MiB into a sandbox limited to %d MiB succeeded", 2*limitMB, limitMB)
	} else if !strings.Contains(err.Error(), "quota") && !strings.Contains(err.Error(), "space") {
		t.Errorf("uploading past the limit: %v, want a disk quota error", err)
	}
	// From inside, after freeing what the upload left.
	out, _ := d.execOut(t, victim.ID, fmt.Sprintf("rm -f /fill-api; dd if=/dev/zero of=/fill bs=1M count=%d 2>&1; sync; stat -c %%s /fill", 2*limitMB))
	if !strings.Contains(out, "Disk quota exceeded") {
		t.Errorf("dd of %d MiB under a %d MiB limit did not hit the quota:\n%s", 2*limitMB, limitMB, out)
	}
	lines := strings.Fields(out)
	var size int64
	if len(lines) > 0 {
		fmt.Sscan(lines[len(lines)-1], &size)
	}
	if size > limitMB<<20 {
		t.Errorf("the sandbox wrote %d bytes under a %d MiB limit", size, limitMB)
	}
}

// churnOne is one short-lived sandbox of the bursts: created, made to
// write a little (half of them under a limit of their own), deleted.
func churnOne(t *testing.T, d *daemon, j int) error {
	opts := corral.CreateOptions{Template: "bb"}
	if j%2 == 0 {
		opts.DiskMB = 16
	}
	sb, err := d.Client.Create(t.Context(), opts)
	if err != nil {
		return fmt.Errorf("creating sandbox %d: %w", j, err)
	}
	res, err := d.Client.Exec(t.Context(), sb.ID, corral.ExecOptions{
		Shell: "dd if=/dev/zero of=/data bs=1M count=2 2>/dev/null && mkdir /many && for i in $(seq 100); do echo $i > /many/$i; done"})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit code %d", res.ExitCode)
	}
	if err != nil {
		err = fmt.Errorf("writing in sandbox %d: %w", j, err)
	}
	return errors.Join(err, d.Client.Delete(t.Context(), sb.ID))
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
