package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Spare networks take Setup's slowest steps off the create path. Making a
// network namespace and a veth pair with its addresses and route depends on
// nothing of the sandbox, so the Manager keeps Config.Spares networks of
// each kind made ahead: a namespace alone, for mode none, and a namespace
// with a veth, for the other modes. Setup takes one when it can: it moves
// the namespace's mount to the sandbox's path and names the veth after the
// sandbox; rules and egress follow as they do without a spare. Without a
// spare, Setup makes everything itself.
//
// A kind is kept only once Setup has asked for it, and spares are made
// SpareDelay after Setup took one, so that making them does not compete
// with the create that took it. A spare's namespace is mounted
// at <StateDir>/netns/.spare-N, a name no sandbox id has (next to the
// empty file that becomes the sandbox's mount point), and its veth
// has no alias: after a crash both are leftovers, which New (the files)
// and Reconcile (the veths) remove. Close removes the Manager's own.

// DefaultSpareDelay is Config.SpareDelay's default.
const DefaultSpareDelay = 200 * time.Millisecond

// A spare's files in netns/: its namespace's mount, sparePrefix and a
// number, and that name with targetSuffix, an empty file that becomes the
// sandbox's mount point.
const (
	sparePrefix  = ".spare-"
	targetSuffix = ".target"
)

// spare is a network made ahead of any sandbox.
type spare struct {
	name string // its file under netns/, and its slot's owner in Manager.used
	slot int    // -1: a namespace alone
}

func spareKind(link bool) int {
	if link {
		return 1
	}
	return 0
}

// takeSpare returns a spare of the kind Setup needs, if one is ready, and
// schedules the making of its replacement.
func (m *Manager) takeSpare(link bool) (spare, bool) {
	if m.cfg.Spares <= 0 {
		return spare{slot: -1}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := spareKind(link)
	m.spareWanted[k] = true
	m.spareRefill.Schedule()
	n := len(m.spares[k])
	if n == 0 {
		return spare{slot: -1}, false
	}
	sp := m.spares[k][n-1]
	m.spares[k] = m.spares[k][:n-1]
	return sp, true
}

// returnSpare puts back a spare that Setup took but could not use.
func (m *Manager) returnSpare(sp spare) {
	m.mu.Lock()
	if !m.closed {
		k := spareKind(sp.slot >= 0)
		m.spares[k] = append(m.spares[k], sp)
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.destroySpare(sp)
}

// makeOneSpare makes a spare of a kind that is short, for the refill
// round (refill.Refiller): false when none is, an error when making it
// failed.
func (m *Manager) makeOneSpare() (bool, error) {
	m.mu.Lock()
	k := m.shortKind()
	m.mu.Unlock()
	if k < 0 {
		return false, nil
	}
	start := time.Now()
	sp, err := m.makeSpare(k == 1)
	if err != nil {
		if !errors.Is(err, errNoRoom) {
			m.log.Warn("making a spare network", "error", err)
		}
		return false, err
	}
	m.log.Debug("spare network made", "name", sp.name, "slot", sp.slot, "duration_ms", float64(time.Since(start).Microseconds())/1000)
	m.mu.Lock()
	m.spares[k] = append(m.spares[k], sp)
	m.mu.Unlock()
	return true, nil
}

// shortKind returns a kind that Setup asked for and that has fewer than
// Config.Spares spares, or -1. The caller holds m.mu.
func (m *Manager) shortKind() int {
	for kind, wanted := range m.spareWanted {
		if wanted && len(m.spares[kind]) < m.cfg.Spares {
			return kind
		}
	}
	return -1
}

// errNoRoom stops the making of spares with a veth when few addresses are
// left: spares must not hold the last ones while Setup needs one.
var errNoRoom = errors.New("too few free addresses for a spare")

// makeSpare makes one spare network, with a veth if link.
func (m *Manager) makeSpare(link bool) (spare, error) {
	m.mu.Lock()
	m.spareSeq++
	sp := spare{name: fmt.Sprintf("%s%d", sparePrefix, m.spareSeq), slot: -1}
	if link {
		if m.slots-len(m.used) <= m.cfg.Spares {
			m.mu.Unlock()
			return sp, errNoRoom
		}
		slot, err := m.allocSlot()
		if err != nil {
			m.mu.Unlock()
			return sp, err
		}
		sp.slot = slot
		m.used[slot] = sp.name
	}
	m.mu.Unlock()
	path := m.netnsPath(sp.name)
	if err := m.makeNetNS(path, sp.slot); err != nil {
		m.freeSpareSlot(sp)
		return sp, err
	}
	f, err := os.OpenFile(path+targetSuffix, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		m.destroySpare(sp)
		return sp, fmt.Errorf("creating netns file: %w", err)
	}
	f.Close()
	return sp, nil
}

// destroySpare removes a spare's namespace and veth, and frees its slot
// unless a sandbox holds it by now.
func (m *Manager) destroySpare(sp spare) {
	path := m.netnsPath(sp.name)
	err := errors.Join(removeNetNS(path), removeNetNS(path+targetSuffix))
	if sp.slot >= 0 {
		err = errors.Join(err, m.deleteLink(m.ifaceName(sp.slot)))
	}
	if err != nil {
		m.log.Warn("removing a spare network", "name", sp.name, "error", err)
	}
	m.freeSpareSlot(sp)
}

func (m *Manager) freeSpareSlot(sp spare) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sp.slot >= 0 && m.used[sp.slot] == sp.name {
		delete(m.used, sp.slot)
	}
}

// removeSpares stops making spares, waits for a refill under way and
// removes every spare. If closing, no spares are made again; otherwise
// the next Setup of a kind asks for them again.
func (m *Manager) removeSpares(closing bool) {
	if closing {
		m.spareRefill.Close()
	} else {
		m.spareRefill.Stop()
	}
	m.mu.Lock()
	m.closed = m.closed || closing
	all := append(m.spares[0], m.spares[1]...)
	m.spares = [2][]spare{}
	m.spareWanted = [2]bool{}
	m.mu.Unlock()
	for _, sp := range all {
		m.destroySpare(sp)
	}
}

// spareIface reports whether name is the veth of one of the Manager's
// spares.
func (m *Manager) spareIface(name string) bool {
	slot, err := strconv.Atoi(strings.TrimPrefix(name, m.cfg.NamePrefix))
	if err != nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.HasPrefix(m.used[slot], sparePrefix)
}

// removeStaleSpares removes the namespace files of spares an earlier
// daemon left behind.
func removeStaleSpares(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("listing netns directory: %w", err)
	}
	var errs []error
	for _, de := range entries {
		if strings.HasPrefix(de.Name(), sparePrefix) {
			errs = append(errs, removeNetNS(filepath.Join(dir, de.Name())))
		}
	}
	return errors.Join(errs...)
}

// moveNetNS moves a spare's namespace to path to: its target file, made
// with the spare, becomes to (a rename, cheaper than creating a file on the
// create path), the namespace is bind-mounted on it, and the spare's mount
// is removed. On failure to does not exist.
func (m *Manager) moveNetNS(sp spare, to string) error {
	from := m.netnsPath(sp.name)
	if err := unix.Renameat2(unix.AT_FDCWD, from+targetSuffix, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("creating netns file: %w", err)
	}
	if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
		return errors.Join(fmt.Errorf("bind-mounting netns %s: %w", from, err), os.Remove(to))
	}
	if err := removeNetNS(from); err != nil {
		return errors.Join(err, removeNetNS(to))
	}
	return nil
}
