package agentserver

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/corralrun/corral/internal/errdefs"
)

// account is who a process runs as.
type account struct {
	name  string // "" when the uid has no passwd entry
	home  string
	shell string              // login shell; "" when the passwd entry names none
	cred  *syscall.Credential // nil: the agent's own user
}

// passwdEntry is the part of an /etc/passwd line the agent uses.
type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
	shell    string
}

// lookupAccount resolves an exec request's user: "" (the agent's own user),
// a name, or a uid, each optionally followed by ":group" (a name or gid).
// It reads the sandbox's /etc/passwd and /etc/group (under Root) on every
// call, so accounts added inside the sandbox are seen at once; the files
// are small. A numeric uid without a passwd entry runs with gid 0 and home
// "/", as container runtimes do.
func (s *Server) lookupAccount(spec string) (account, error) {
	if spec == "" {
		return s.ownAccount()
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return account{}, errorf(errdefs.ErrInvalidArgument, "invalid user %q: want name or uid, optionally with :group", spec)
	}
	e, err := s.findUser(userPart)
	if err != nil {
		return account{}, err
	}
	gid := e.gid
	if hasGroup {
		if gid, err = s.findGroup(groupPart); err != nil {
			return account{}, err
		}
	}
	groups, err := s.groupsOf(e.name, gid)
	if err != nil {
		return account{}, err
	}
	return account{
		name:  e.name,
		home:  homeOr(e.home),
		shell: e.shell,
		cred:  &syscall.Credential{Uid: e.uid, Gid: gid, Groups: groups},
	}, nil
}

// ownAccount describes the agent's own user, which needs no credential.
func (s *Server) ownAccount() (account, error) {
	uid := uint32(os.Geteuid())
	e, ok, err := s.findPasswd(func(e passwdEntry) bool { return e.uid == uid })
	switch {
	case err != nil:
		return account{}, err
	case ok:
		return account{name: e.name, home: homeOr(e.home), shell: e.shell}, nil
	case uid == 0:
		return account{name: "root", home: "/root"}, nil
	default:
		return account{home: "/"}, nil
	}
}

// findUser returns the passwd entry of a user name or uid; a uid without
// an entry gets one with only the uid (gid 0, no name, no home).
func (s *Server) findUser(user string) (passwdEntry, error) {
	if uid, err := strconv.ParseUint(user, 10, 32); err == nil {
		e, ok, err := s.findPasswd(func(e passwdEntry) bool { return e.uid == uint32(uid) })
		if !ok && err == nil {
			e = passwdEntry{uid: uint32(uid)}
		}
		return e, err
	}
	e, ok, err := s.findPasswd(func(e passwdEntry) bool { return e.name == user })
	if err == nil && !ok {
		err = errorf(errdefs.ErrInvalidArgument, "unknown user %q", user)
	}
	return e, err
}

// findGroup returns the gid of a group name or gid.
func (s *Server) findGroup(group string) (uint32, error) {
	if n, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(n), nil
	}
	var gid uint32
	found := false
	err := s.scanGroups(func(name string, g uint32, _ []string) bool {
		if name == group {
			gid, found = g, true
			return false
		}
		return true
	})
	if err == nil && !found {
		err = errorf(errdefs.ErrInvalidArgument, "unknown group %q", group)
	}
	return gid, err
}

// groupsOf returns gid followed by every other group that lists the user
// name as a member; a user without a name has gid alone.
func (s *Server) groupsOf(name string, gid uint32) ([]uint32, error) {
	groups := []uint32{gid}
	if name == "" {
		return groups, nil
	}
	err := s.scanGroups(func(_ string, g uint32, members []string) bool {
		if slices.Contains(members, name) && !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
		return true
	})
	return groups, err
}

func homeOr(home string) string {
	if home == "" {
		return "/"
	}
	return home
}

// findPasswd returns the first /etc/passwd entry that match accepts. A
// missing file (or no usable file system) is an empty database.
func (s *Server) findPasswd(match func(passwdEntry) bool) (passwdEntry, bool, error) {
	var found passwdEntry
	ok := false
	err := s.scanDB("/etc/passwd", func(fields []string) bool {
		// name:password:uid:gid:gecos:home:shell
		if len(fields) < 7 {
			return true
		}
		uid, err1 := strconv.ParseUint(fields[2], 10, 32)
		gid, err2 := strconv.ParseUint(fields[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		e := passwdEntry{name: fields[0], uid: uint32(uid), gid: uint32(gid), home: fields[5], shell: fields[6]}
		if match(e) {
			found, ok = e, true
			return false
		}
		return true
	})
	return found, ok, err
}

// scanGroups calls fn for each /etc/group entry until it returns false.
func (s *Server) scanGroups(fn func(name string, gid uint32, members []string) bool) error {
	return s.scanDB("/etc/group", func(fields []string) bool {
		// name:password:gid:member,member
		if len(fields) < 4 {
			return true
		}
		gid, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			return true
		}
		var members []string
		if fields[3] != "" {
			members = strings.Split(fields[3], ",")
		}
		return fn(fields[0], uint32(gid), members)
	})
}

// scanDB calls fn with the colon-separated fields of each entry of a
// passwd-style file until fn returns false. Comments, blank lines and NIS
// compat lines ("+", "-") are skipped.
func (s *Server) scanDB(name string, fn func(fields []string) bool) error {
	fsys, err := s.files()
	if errors.Is(err, errShuttingDown) {
		return err
	}
	if err != nil {
		return nil // no sandbox file system: an empty database
	}
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fsError("reading "+name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fsError("reading "+name, err)
	}
	return nil
}
