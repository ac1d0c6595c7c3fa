package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// mountUser returns the host IDs of the user that the owner of a mounted
// directory becomes in sandbox sb, whose root user runs as root on the
// host: the user an exec runs as when its request names none, which is
// the template's default user (Defaults.User), or root when the template
// has none. The user is looked up in the sandbox's own /etc/passwd and
// /etc/group under rootfs, as the agent looks it up for an exec; the
// sandbox's user namespace maps its IDs one to one from root's.
func (m *Manager) mountUser(sb Sandbox, rootfs string, root driver.HostIDs) (driver.HostIDs, error) {
	m.mu.RLock()
	var spec string
	if t, ok := m.templates[sb.Template]; ok && t.Defaults != nil {
		spec = t.Defaults.User
	}
	m.mu.RUnlock()
	if spec == "" {
		return root, nil
	}
	uid, gid, err := lookupUser(rootfs, spec)
	if err != nil {
		return driver.HostIDs{}, fmt.Errorf("template %s's default user %q: %w", sb.Template, spec, err)
	}
	if uid >= driver.StoredIDSize || gid >= driver.StoredIDSize {
		return driver.HostIDs{}, errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"template %s's default user %q is %d:%d, outside the sandbox's %d IDs: a mount cannot be shown as that user's", sb.Template, spec, uid, gid, driver.StoredIDSize)
	}
	return driver.HostIDs{UID: root.UID + uid, GID: root.GID + gid}, nil
}

// lookupUser resolves spec, a user name or uid optionally followed by
// ":group" (a name or gid), in the passwd and group files of the tree at
// rootfs, with the agent's rules: a uid without a passwd entry has gid 0.
func lookupUser(rootfs, spec string) (uid, gid uint32, err error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return 0, 0, errdefs.Errorf(errdefs.ErrFailedPrecondition, "want a name or uid, optionally with :group")
	}
	r, err := os.OpenRoot(rootfs)
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	n, isNum := parseID(userPart)
	byUser := func(f []string) bool {
		if isNum {
			u, ok := parseID(f[2])
			return ok && u == n
		}
		return f[0] == userPart
	}
	uid, gid, found, err := findID(r, "etc/passwd", byUser, 2, 3)
	switch {
	case err != nil:
		return 0, 0, err
	case !found && !isNum:
		return 0, 0, errdefs.Errorf(errdefs.ErrFailedPrecondition, "no user %q in the sandbox's /etc/passwd", userPart)
	case !found:
		uid, gid = n, 0
	}
	if !hasGroup {
		return uid, gid, nil
	}
	if n, ok := parseID(groupPart); ok {
		return uid, n, nil
	}
	_, gid, found, err = findID(r, "etc/group", func(f []string) bool { return f[0] == groupPart }, 2, 2)
	if err == nil && !found {
		err = errdefs.Errorf(errdefs.ErrFailedPrecondition, "no group %q in the sandbox's /etc/group", groupPart)
	}
	return uid, gid, err
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// findID scans name, a colon-separated account file under r, for the
// first line that match accepts and returns its fields a and b as IDs. A
// missing file has no lines.
func findID(r *os.Root, name string, match func([]string) bool, a, b int) (uint32, uint32, bool, error) {
	f, err := r.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) <= max(a, b) || !match(fields) {
			continue
		}
		x, okA := parseID(fields[a])
		y, okB := parseID(fields[b])
		if okA && okB {
			return x, y, true, nil
		}
	}
	return 0, 0, false, sc.Err()
}
