package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// SocketPath returns the unix socket path of a CORRAL_HOST value, and false
// when the host is not a unix socket (TCP hosts have no peer credentials).
func SocketPath(host string) (string, bool) {
	if host == "" {
		host = "unix:///run/corral/corral.sock" // the SDK's DefaultHost
	}
	p, ok := strings.CutPrefix(host, "unix://")
	if !ok || p == "" {
		return "", false
	}
	return p, true
}

// PeerPID connects to the unix socket at path and returns the pid of the
// process that accepted, from SO_PEERCRED (see unix(7)): "the credentials
// of the peer process ... are those that were in effect at the time of the
// call to connect(2) or socketpair(2)"; for a listening socket that is the
// process that called listen, the daemon.
func PeerPID(ctx context.Context, path string) (int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return 0, fmt.Errorf("connecting to %s: %w", path, err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("reading peer of %s: %w", path, err)
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("reading peer of %s: %w", path, err)
	}
	if credErr != nil {
		return 0, fmt.Errorf("reading peer credentials of %s: %w", path, credErr)
	}
	return int(cred.Pid), nil
}

// RSSBytes returns the resident set size of process pid (VmRSS in
// /proc/<pid>/status).
func RSSBytes(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("reading rss of pid %d: %w", pid, err)
	}
	defer f.Close()
	return parseVmRSS(f)
}

// parseVmRSS finds the "VmRSS:  1234 kB" line of a proc status file.
func parseVmRSS(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmRSS line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing VmRSS %q: %w", f[0], err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmRSS line in status")
}
