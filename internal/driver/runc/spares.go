package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/refill"
)

// Spare user namespaces take a slot and its namespaces off a create's
// path (the slot's directories and links under the host-wide lock, then
// the holders' forks and execs). None depends on the sandbox, so the
// driver keeps Config.UserNSSpares of them made, each a slot taken for a
// marker directory under <Root>/userns-spares, the sandbox's namespace in
// the slot's range, owned by the slot's owner and held by its holder's
// zombie, and its layers' namespace (layerMap). ReserveIDs takes one by
// pointing the slot's owner link at the sandbox's directory; replacements
// are made spareDelay after a take, so that making them does not compete
// with the create that took one. A burst larger than the spares makes the
// rest in ReserveIDs, as without spares.
//
// After a crash the markers are gone with the next New (it removes the
// directory before it sweeps slots), which leaves their slots stale: the
// sweep frees them. Close frees the Driver's own.

// spareDelay is how long after ReserveIDs takes a spare the driver starts to
// replace it.
const spareDelay = 200 * time.Millisecond

// nsSpare is a slot and its user namespace, made ahead.
type nsSpare struct {
	slot   int
	mnt    string
	marker string   // the directory the slot's owner link names until a sandbox takes it
	ns     *userNS  // the sandbox's namespace, in the slot's range
	idmap  *os.File // the namespace its root's layers are mapped with (layerMap)
}

// nsSpares is the Driver's set of spares.
type nsSpares struct {
	mu     sync.Mutex
	ready  []nsSpare
	seq    int
	refill *refill.Refiller
}

func (d *Driver) sparesDir() string { return filepath.Join(d.cfg.Root, "userns-spares") }

// takeNSSpare takes a spare for the sandbox directory dir, if one is
// ready, and schedules its replacement. It returns false when there is
// none or it could not be taken (the spare is then released).
func (d *Driver) takeNSSpare(dir string) (nsSpare, bool) {
	s := &d.spares
	if d.cfg.UserNSSpares <= 0 {
		return nsSpare{}, false
	}
	s.refill.Schedule()
	s.mu.Lock()
	n := len(s.ready)
	if n == 0 {
		s.mu.Unlock()
		return nsSpare{}, false
	}
	sp := s.ready[n-1]
	s.ready = s.ready[:n-1]
	s.mu.Unlock()
	if err := d.claimSlot(sp, dir); err != nil {
		d.log.Warn("taking a spare user namespace", "slot", sp.slot, "error", err)
		d.destroyNSSpare(sp)
		return nsSpare{}, false
	}
	return sp, true
}

// claimSlot hands sp's slot to the sandbox directory dir: the slot's
// owner link names dir, and dir's rootfs link the slot's mount point, as
// allocSlot would have made them. The rootfs link comes first: a crash
// between the two leaves the slot owned by the spare's marker, which the
// next New removes, so that its sweep frees the slot; the other way round
// the slot would belong to a sandbox directory that does not name it, and
// the sandbox's Delete could not free it.
func (d *Driver) claimSlot(sp nsSpare, dir string) error {
	unlock, err := d.lockSlots()
	if err != nil {
		return err
	}
	defer unlock()
	link := filepath.Join(dir, rootfsLink)
	if err := os.Symlink(sp.mnt, link); err != nil {
		return fmt.Errorf("claiming slot %d: %w", sp.slot, err)
	}
	owner := filepath.Join(d.slotDir(sp.slot), "owner")
	if err := d.repoint(owner, dir); err != nil {
		// The owner is still the marker, which destroyNSSpare releases.
		return errors.Join(fmt.Errorf("claiming slot %d: %w", sp.slot, err), os.Remove(link))
	}
	os.Remove(filepath.Join(sp.marker, rootfsLink))
	os.Remove(sp.marker)
	return nil
}

// repoint makes the owner link owner name dir.
func (d *Driver) repoint(owner, dir string) error {
	tmp := owner + ".new"
	os.Remove(tmp)
	if err := os.Symlink(dir, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, owner); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// makeOneNSSpare makes a spare if fewer than Config.UserNSSpares are
// ready, for the refill round (refill.Refiller).
func (d *Driver) makeOneNSSpare() (bool, error) {
	s := &d.spares
	s.mu.Lock()
	short := len(s.ready) < d.cfg.UserNSSpares
	s.seq++
	seq := s.seq
	s.mu.Unlock()
	if !short {
		return false, nil
	}
	sp, err := d.makeNSSpare(seq)
	if err != nil {
		d.log.Warn("making a spare user namespace", "error", err)
		return false, err
	}
	s.mu.Lock()
	s.ready = append(s.ready, sp)
	s.mu.Unlock()
	return true, nil
}

// makeNSSpare takes a slot for a new marker directory and makes its
// namespace.
func (d *Driver) makeNSSpare(seq int) (nsSpare, error) {
	marker := filepath.Join(d.sparesDir(), strconv.Itoa(seq))
	if err := os.MkdirAll(d.sparesDir(), 0o700); err != nil {
		return nsSpare{}, err
	}
	if err := os.Mkdir(marker, 0o700); err != nil {
		return nsSpare{}, err
	}
	sp, err := d.newRange(marker)
	if err != nil {
		os.Remove(marker)
		return nsSpare{}, err
	}
	sp.marker = marker
	return sp, nil
}

// destroyNSSpare reaps the spare's holder and frees its slot and marker.
func (d *Driver) destroyNSSpare(sp nsSpare) {
	sp.close()
	err := d.releaseSlot(sp.marker)
	if rerr := os.Remove(sp.marker); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		d.log.Warn("removing a spare user namespace", "slot", sp.slot, "error", err)
	}
}

// closeNSSpares stops making spares, waits for a refill under way and
// removes every spare.
func (d *Driver) closeNSSpares() {
	s := &d.spares
	s.refill.Close()
	s.mu.Lock()
	all := s.ready
	s.ready = nil
	s.mu.Unlock()
	for _, sp := range all {
		d.destroyNSSpare(sp)
	}
}
