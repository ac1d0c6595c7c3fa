package btrfs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/storage/internal/fsutil"
)

// Disk limits are qgroup limits, and a qgroup limit is only as good as the
// kernel's accounting behind it. Full accounting (the classic mode) counts
// shared extents exactly, but goes inconsistent when a qgroup is removed
// while it still counts bytes or when a deep subvolume is dropped, and
// then enforces nothing until a rescan: a limit silently off. Simple
// quotas (Linux 6.7) charge each extent to the subvolume that wrote it,
// which is all a root's limit needs, and never go inconsistent. So the
// backend enables simple quotas where the kernel has them and keeps full
// accounting honest where it must use it:
//   - a deleted root's qgroup is removed only once its counts are zero
//     (by the watcher, in the background);
//   - full mode drops subvolumes with exact accounting however deep they
//     are (drop_subtree_threshold at its maximum);
//   - a watcher reads the filesystem's inconsistent flag; while it is set
//     the backend logs it, rescans (full mode), reports it in QuotaStatus
//     and refuses roots that ask for a limit with errdefs.ErrUnavailable.

// Quota modes of Config.QuotaMode.
const (
	// QuotaSimple charges each extent to the subvolume that allocated it
	// (the kernel's simple quotas, Linux 6.7 and later).
	QuotaSimple = "simple"
	// QuotaFull is the kernel's classic qgroup accounting.
	QuotaFull = "full"
)

// DefaultQuotaCheckInterval is how often the watcher reads the
// accounting's state and removes the qgroups of deleted roots.
const DefaultQuotaCheckInterval = time.Second

// btrfsMaxLevel is BTRFS_MAX_LEVEL, the deepest a btrfs tree can be: as
// qgroups/drop_subtree_threshold it makes the kernel account every dropped
// subtree instead of marking the accounting inconsistent.
const btrfsMaxLevel = 8

// qgroupGiveUp is how long a deleted root's qgroup may keep counting
// bytes before the watcher stops waiting for it. Under simple quotas an
// extent stays charged to the root that wrote it while anything still
// references it (a clone kept in a snapshot or a template), which can be
// for good; such a qgroup limits nothing, as its subvolume is gone.
const qgroupGiveUp = 10 * time.Minute

// quotaRetryAfter is the retry hint of roots refused while the accounting
// is inconsistent: about what a rescan of a small filesystem takes.
const quotaRetryAfter = 5 * time.Second

// quota is the backend's disk quota state.
type quota struct {
	want     string        // Config.QuotaMode
	interval time.Duration // between watcher checks

	mu   sync.Mutex // orders enabling and switching modes
	mode string     // in force, "" while quotas are off; under mu

	// Qgroups of deleted roots and spares, waiting for their counts to
	// reach zero, with when each was queued; under pendingMu.
	pendingMu sync.Mutex
	pending   map[uint64]time.Time
	lastSync  time.Time // of removeQgroups; only the watcher uses it

	stateMu         sync.Mutex // guards the fields below
	inconsistent    bool       // as checkQuota last read it
	inconsistencies int64
	repairFailed    bool // a rescan failed during this inconsistency

	stop chan struct{} // closed by Close
	done chan struct{} // closed when the watcher has returned
}

func (b *Backend) qgroupsSysfs() string {
	return filepath.Join("/sys/fs/btrfs", b.fsid, "qgroups")
}

// quotasEnabled reports whether qgroup accounting is on: sysfs shows a
// qgroups directory for the filesystem exactly then.
func (b *Backend) quotasEnabled() bool {
	_, err := os.Stat(b.qgroupsSysfs())
	return err == nil
}

// kernelQuotaMode reads the mode in force from sysfs: QuotaSimple,
// QuotaFull, or "" when quotas are off. Kernels without simple quotas
// have no mode file and only full accounting.
func (b *Backend) kernelQuotaMode() string {
	if !b.quotasEnabled() {
		return ""
	}
	m, err := os.ReadFile(filepath.Join(b.qgroupsSysfs(), "mode"))
	if err == nil && string(bytes.TrimSpace(m)) == "squota" {
		return QuotaSimple
	}
	return QuotaFull
}

// checkQuotaMode refuses an unknown Config.QuotaMode.
func checkQuotaMode(mode string) error {
	switch mode {
	case "", QuotaSimple, QuotaFull:
		return nil
	}
	return errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown btrfs quota mode %q (simple or full)", mode)
}

// kernelHasSimpleQuotas reports whether the kernel can count simple
// quotas: those that can show the mode in sysfs, where quotas are on.
func (b *Backend) kernelHasSimpleQuotas() bool {
	_, err := os.Stat(filepath.Join(b.qgroupsSysfs(), "mode"))
	return err == nil
}

// openQuota brings quotas that an earlier daemon enabled into cfg's mode
// and starts the watcher. A filesystem without quotas stays so until a
// root asks for a limit.
func (b *Backend) openQuota(cfg Config) error {
	q := &b.quota
	q.want, q.interval = cfg.QuotaMode, cfg.QuotaCheckInterval
	if q.want == "" {
		q.want = QuotaSimple
	}
	if q.interval <= 0 {
		q.interval = DefaultQuotaCheckInterval
	}
	q.mode = b.kernelQuotaMode()
	if err := b.restoreLimits(); err != nil {
		return err
	}
	if q.mode == QuotaFull && q.want == QuotaSimple && b.kernelHasSimpleQuotas() {
		if err := b.switchToSimple(); err != nil {
			return err
		}
	}
	if q.mode == QuotaFull {
		b.exactDrops()
	}
	q.stop, q.done = make(chan struct{}), make(chan struct{})
	go b.watchQuota()
	return nil
}

// closeQuota stops the watcher and waits for it. Qgroups still waiting
// for removal stay: a qgroup whose subvolume is gone limits nothing, and
// recent kernels remove those of fully dropped subvolumes themselves.
func (b *Backend) closeQuota() {
	q := &b.quota
	if q.stop == nil {
		return
	}
	select {
	case <-q.stop:
	default:
		close(q.stop)
	}
	<-q.done
}

// ensureQuota enables quotas the first time a limit is asked for, so a
// filesystem that never needs a limit never pays for accounting. It falls
// back to full accounting on kernels without simple quotas.
func (b *Backend) ensureQuota() error {
	q := &b.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.mode != "" {
		return nil
	}
	if m := b.kernelQuotaMode(); m != "" { // enabled by hand since New
		q.mode = m
		return nil
	}
	fd, err := openDir(b.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	mode := q.want
	err = enableQuota(fd, mode == QuotaSimple)
	if mode == QuotaSimple && errors.Is(err, unix.EINVAL) {
		b.log.Warn("kernel has no simple btrfs quotas; using full accounting", "path", b.base)
		mode = QuotaFull
		err = enableQuota(fd, false)
	}
	if err != nil {
		return err
	}
	q.mode = mode
	if mode == QuotaFull {
		b.exactDrops()
	}
	b.log.Info("enabled btrfs quotas", "path", b.base, "mode", mode)
	return nil
}

// switchToSimple replaces full accounting, found on the filesystem at
// start, with simple quotas, and puts back the limits the roots had.
// Simple quotas count only what is written from now on, so until they
// are rewritten, a root's earlier bytes do not count against its limit;
// that is why the switch is logged. The limits are written to a file
// first, so that a crash between turning quotas off and putting them back
// loses none: the next start finds the file (restoreLimits).
func (b *Backend) switchToSimple() error {
	q := &b.quota
	limits, err := b.rootLimits()
	if err != nil {
		return err
	}
	if err := writeLimits(b.limitsFile(), limits); err != nil {
		return err
	}
	fd, err := openDir(b.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := disableQuota(fd); err != nil {
		return fmt.Errorf("disabling full btrfs quotas: %w", err)
	}
	q.mode = ""
	if err := enableQuota(fd, true); err != nil {
		return fmt.Errorf("enabling simple btrfs quotas: %w", err)
	}
	q.mode = QuotaSimple
	b.log.Warn("switched btrfs quotas from full accounting to simple quotas; bytes that roots wrote before count against their limits only once rewritten",
		"path", b.base, "limited_roots", len(limits))
	return b.restoreLimits()
}

// limitsFile holds the roots' limits while quotas change mode.
func (b *Backend) limitsFile() string { return filepath.Join(b.base, "quota-limits.json") }

// writeLimits records limits (subvolume ID to bytes) durably at path.
func writeLimits(path string, limits map[uint64]uint64) error {
	data, err := json.Marshal(limits)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("recording disk limits: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("recording disk limits: %w", err)
	}
	return nil
}

// restoreLimits applies the limits that switchToSimple recorded, if a
// record is there, enabling quotas first when a crash left them off, and
// removes the record.
func (b *Backend) restoreLimits() error {
	data, err := os.ReadFile(b.limitsFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading recorded disk limits: %w", err)
	}
	var limits map[uint64]uint64
	if err := json.Unmarshal(data, &limits); err != nil {
		return fmt.Errorf("reading recorded disk limits: %w", err)
	}
	if b.quota.mode == "" {
		if err := b.ensureQuota(); err != nil {
			return err
		}
	}
	fd, err := openDir(b.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for id, bytes := range limits {
		// A root deleted meanwhile has no qgroup to limit.
		if err := limitExclusive(fd, id, bytes); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("restoring disk limit of subvolume %d: %w", id, err)
		}
	}
	return os.Remove(b.limitsFile())
}

// rootLimits returns the exclusive-bytes limit of every root and volume
// that has one, by subvolume ID.
func (b *Backend) rootLimits() (map[uint64]uint64, error) {
	limits := map[uint64]uint64{}
	for _, dir := range []string{b.rootsDir(), b.volumesDir()} {
		names, err := fsutil.ListNames(dir)
		if err != nil {
			return nil, err
		}
		for _, r := range names {
			id, err := subvolIDAt(filepath.Join(dir, r))
			if err != nil {
				return nil, err
			}
			if n, ok := b.qgroupValue(id, "max_exclusive"); ok && n > 0 {
				limits[id] = n
			}
		}
	}
	return limits, nil
}

// exactDrops makes full accounting trace every dropped subtree, however
// deep, instead of giving up and marking itself inconsistent. Kernels
// without the knob trace everything already.
func (b *Backend) exactDrops() {
	p := filepath.Join(b.qgroupsSysfs(), "drop_subtree_threshold")
	if err := os.WriteFile(p, []byte(strconv.Itoa(btrfsMaxLevel)), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		b.log.Warn("cannot make btrfs quotas account deep subvolume drops", "err", err)
	}
}

// qgroupValue reads one number of qgroup 0/id from sysfs; ok is false
// when the qgroup does not exist.
func (b *Backend) qgroupValue(id uint64, name string) (uint64, bool) {
	data, err := os.ReadFile(filepath.Join(b.qgroupsSysfs(), fmt.Sprintf("0_%d", id), name))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(data)), 10, 64)
	return n, err == nil
}

// dropQgroup hands the qgroup of a deleted subvolume to the watcher.
func (b *Backend) dropQgroup(id uint64) {
	q := &b.quota
	q.pendingMu.Lock()
	defer q.pendingMu.Unlock()
	if q.pending == nil {
		q.pending = map[uint64]time.Time{}
	}
	q.pending[id] = time.Now()
}

// releasing counts the qgroups waiting for removal.
func (b *Backend) releasing() int {
	b.quota.pendingMu.Lock()
	defer b.quota.pendingMu.Unlock()
	return len(b.quota.pending)
}

// watchQuota runs until closeQuota: it checks the accounting and removes
// the qgroups of deleted subvolumes every interval.
func (b *Backend) watchQuota() {
	q := &b.quota
	defer close(q.done)
	t := time.NewTicker(q.interval)
	defer t.Stop()
	for {
		select {
		case <-q.stop:
			return
		case <-t.C:
		}
		b.checkQuota()
		b.removeQgroups()
	}
}

// inconsistentNow reads the filesystem's inconsistent flag; false while
// quotas are off.
func (b *Backend) inconsistentNow() bool {
	data, err := os.ReadFile(filepath.Join(b.qgroupsSysfs(), "inconsistent"))
	return err == nil && string(bytes.TrimSpace(data)) == "1"
}

// checkQuota reads the accounting's inconsistent flag and reports whether
// limits are enforced: true when quotas are off or consistent. On the
// change to inconsistent it logs an error and counts it; while it stays
// so it keeps a rescan going where the mode allows one.
func (b *Backend) checkQuota() bool {
	q := &b.quota
	bad := b.inconsistentNow()
	q.stateMu.Lock()
	was := q.inconsistent
	q.inconsistent = bad
	if bad && !was {
		q.inconsistencies++
	}
	if !bad {
		q.repairFailed = false
	}
	q.stateMu.Unlock()
	if !bad {
		if was {
			b.log.Info("btrfs quota accounting is consistent again: disk limits are enforced", "path", b.base)
		}
		return true
	}
	mode := b.kernelQuotaMode()
	if !was {
		b.log.Error("btrfs quota accounting is inconsistent: disk limits are not enforced; roots with a disk limit are refused until it is repaired",
			"path", b.base, "mode", mode)
	}
	if mode == QuotaFull {
		b.repairQuota()
	}
	return false
}

// repairQuota starts a rescan of full accounting unless one runs. Simple
// quotas cannot be rescanned, and do not go inconsistent in the first
// place. A failure is logged once per inconsistency.
func (b *Backend) repairQuota() {
	fd, err := openDir(b.base)
	if err == nil {
		defer unix.Close(fd)
		var running bool
		if running, err = rescanRunning(fd); err == nil && running {
			return
		}
		if err = startRescan(fd); err == nil {
			b.log.Info("rescanning btrfs quotas", "path", b.base)
			return
		}
		if errors.Is(err, unix.EINPROGRESS) {
			return
		}
	}
	q := &b.quota
	q.stateMu.Lock()
	logged := q.repairFailed
	q.repairFailed = true
	q.stateMu.Unlock()
	if !logged {
		b.log.Error("cannot rescan btrfs quotas", "path", b.base, "err", err)
	}
}

// removeQgroups removes the pending qgroups whose counts are back to zero.
// The kernel refuses (EBUSY) while the subvolume is not fully dropped, and
// full accounting updates the counts only at a commit; so while any waits,
// it commits the filesystem (BTRFS_IOC_SYNC, which also wakes the cleaner
// that drops deleted subvolumes), at most every five checks. A qgroup
// still counting bytes after qgroupGiveUp is left as it is.
func (b *Backend) removeQgroups() {
	q := &b.quota
	q.pendingMu.Lock()
	pending := maps.Clone(q.pending)
	q.pendingMu.Unlock()
	if len(pending) == 0 {
		return
	}
	fd, err := openDir(b.base)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	done := func(id uint64) {
		q.pendingMu.Lock()
		delete(q.pending, id)
		q.pendingMu.Unlock()
	}
	waiting := false
	for id, since := range pending {
		rfer, ok := b.qgroupValue(id, "referenced")
		excl, _ := b.qgroupValue(id, "exclusive")
		if !ok { // gone: removed by the kernel, or never made
			done(id)
			continue
		}
		if rfer != 0 || excl != 0 {
			if time.Since(since) > qgroupGiveUp {
				b.log.Info("leaving qgroup of deleted root that still counts bytes", "qgroup", fmt.Sprintf("0/%d", id),
					"referenced_bytes", rfer, "exclusive_bytes", excl)
				done(id)
			} else {
				waiting = true
			}
			continue
		}
		switch err := destroyQgroup(fd, id); {
		case err == nil, errors.Is(err, unix.ENOENT):
			done(id)
		case errors.Is(err, unix.EBUSY):
			waiting = true
		default:
			b.log.Warn("leaving qgroup of deleted root to the kernel", "qgroup", fmt.Sprintf("0/%d", id), "err", err)
			done(id)
		}
	}
	if waiting && time.Since(q.lastSync) >= 5*q.interval {
		q.lastSync = time.Now()
		_ = syncFS(fd)
	}
}

// QuotaStatus reports the state of disk quota accounting
// (storage.QuotaReporter). It reads sysfs and asks the kernel whether a
// rescan runs; it changes nothing, the watcher does.
func (b *Backend) QuotaStatus() storage.QuotaStatus {
	s := storage.QuotaStatus{Consistent: true, Inconsistencies: b.inconsistencies(), Releasing: b.releasing()}
	if s.Mode = b.kernelQuotaMode(); s.Mode == "" {
		return s
	}
	s.Enabled, s.Consistent = true, !b.inconsistentNow()
	if fd, err := openDir(b.base); err == nil {
		s.Repairing, _ = rescanRunning(fd)
		unix.Close(fd)
	}
	return s
}

func (b *Backend) inconsistencies() int64 {
	b.quota.stateMu.Lock()
	defer b.quota.stateMu.Unlock()
	return b.quota.inconsistencies
}

// limitedRootAllowed refuses a root or volume (what) with a disk limit
// while the limit would not be enforced.
func (b *Backend) limitedRootAllowed(what string) error {
	if b.checkQuota() {
		return nil
	}
	return errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable,
		"cannot create %s with a disk limit: disk quota accounting is inconsistent and being repaired", what), quotaRetryAfter)
}

// limitRoot limits the exclusive bytes of the subvolume at path.
func limitRoot(path string, bytes uint64) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	id, err := subvolID(fd)
	if err != nil {
		return fmt.Errorf("looking up subvolume id of %s: %w", path, err)
	}
	return limitExclusive(fd, id, bytes)
}
