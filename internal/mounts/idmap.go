package mounts

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/userns"
)

// idPair is the host IDs a sandbox's root and its default user run as.
type idPair struct{ root, user driver.HostIDs }

// idmaps holds the user namespaces that ID-mapped mounts use, one per
// mapping: making one costs a process, and the sandboxes of a runtime
// often share their IDs. Sandboxes with a host
// ID range of their own each have their own root IDs, so at most
// maxIDMaps are kept; a mount keeps its namespace alive by itself.
// Callers hold the Mounter's lock from get until they are done with the
// descriptor, which no other get can then close.
type idmaps struct {
	mu     sync.Mutex
	byID   map[string]*os.File // by the namespace's uid and gid maps
	holder *userns.Holder      // nil: namespaces re-execute this binary
}

// maxIDMaps bounds the namespaces idmaps keeps open.
const maxIDMaps = 64

// newIDMaps returns idmaps that make namespaces with the holder program
// where it runs, and by re-executing this binary (slower: a full fork of
// the daemon) where it does not, saying why in the error.
func newIDMaps() (*idmaps, error) {
	h, err := userns.OpenHolder()
	return &idmaps{byID: map[string]*os.File{}, holder: h}, err
}

// get returns a descriptor of a user namespace for an ID-mapped mount of
// a directory of owner in a sandbox that runs as sb: owner's files show
// as the sandbox user's, whose writes land as owner's. When the user is
// not root, the sandbox root's host IDs are mapped too, to the stored
// root (driver.StoredIDBase), so that root may create files there as it
// does in the sandbox's own volumes (gVisor's gofer creates every file as
// root before giving it to its owner). It returns -1 when no mapping is
// needed. The descriptor stays the idmaps'.
func (m *idmaps) get(owner driver.HostIDs, sb idPair) (int, error) {
	if owner == sb.user && sb.user == sb.root {
		return -1, nil
	}
	fd, err := m.namespace(mapping(owner.UID, sb.root.UID, sb.user.UID), mapping(owner.GID, sb.root.GID, sb.user.GID))
	if err != nil {
		return -1, fmt.Errorf("making the ID mapping for owner %d:%d: %w", owner.UID, owner.GID, err)
	}
	return fd, nil
}

// getRange returns a descriptor of a user namespace in which size IDs
// from owner's up show as those from root's up (owner+i as root+i), or -1
// when the two ranges start at the same IDs. The descriptor stays the
// idmaps'.
func (m *idmaps) getRange(owner, root driver.HostIDs, size uint32) (int, error) {
	if owner == root {
		return -1, nil
	}
	fd, err := m.namespace(
		[]syscall.SysProcIDMap{{ContainerID: int(owner.UID), HostID: int(root.UID), Size: int(size)}},
		[]syscall.SysProcIDMap{{ContainerID: int(owner.GID), HostID: int(root.GID), Size: int(size)}})
	if err != nil {
		return -1, fmt.Errorf("making the ID mapping from %d:%d to %d:%d: %w", owner.UID, owner.GID, root.UID, root.GID, err)
	}
	return fd, nil
}

// namespace returns the descriptor of a namespace with the given maps,
// made once and kept until maxIDMaps others are.
func (m *idmaps) namespace(uids, gids []syscall.SysProcIDMap) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := fmt.Sprint(uids, gids)
	if f, ok := m.byID[key]; ok {
		return int(f.Fd()), nil
	}
	f, err := m.make(uids, gids)
	if err != nil {
		return -1, err
	}
	if len(m.byID) >= maxIDMaps {
		for k, old := range m.byID {
			old.Close()
			delete(m.byID, k)
		}
	}
	m.byID[key] = f
	return int(f.Fd()), nil
}

// mapping returns the lines of one ID map (namespace ID: the ID on disk,
// host ID: the ID the sandbox runs as): owner as user and, when user is
// not root, the stored root as root. An owner that is the stored root
// itself is mapped alone.
func mapping(owner, root, user uint32) []syscall.SysProcIDMap {
	m := []syscall.SysProcIDMap{{ContainerID: int(owner), HostID: int(user), Size: 1}}
	if user != root && owner != driver.StoredIDBase {
		m = append(m, syscall.SysProcIDMap{ContainerID: driver.StoredIDBase, HostID: int(root), Size: 1})
	}
	return m
}

// make makes a user namespace with the maps, owned by host root (only
// the daemon's mounts use it), and returns it open; its holder process is
// gone by then, and the descriptor alone keeps it.
func (m *idmaps) make(uids, gids []syscall.SysProcIDMap) (*os.File, error) {
	ns, err := m.holder.New(0, idMapLines(uids), idMapLines(gids))
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(ns.Fd), ns.Path)
	ns.Fd = -1 // now f's
	ns.Close()
	return f, nil
}

// idMapLines writes ms as the lines of uid_map(5).
func idMapLines(ms []syscall.SysProcIDMap) string {
	var b strings.Builder
	for _, l := range ms {
		fmt.Fprintf(&b, "%d %d %d\n", l.ContainerID, l.HostID, l.Size)
	}
	return b.String()
}

func (m *idmaps) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for k, f := range m.byID {
		errs = append(errs, f.Close())
		delete(m.byID, k)
	}
	errs = append(errs, m.holder.Close())
	return errors.Join(errs...)
}
