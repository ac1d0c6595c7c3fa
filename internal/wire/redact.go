package wire

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
)

// HostPath stands for a host path left out of an error message.
const HostPath = "<host path>"

// Redact returns what a client of the daemon may be told of err, and ref:
// empty when err may go out as it is, else a reference for the caller to
// log err under, in full, as the client is told ref instead of what was
// left out.
//
// An internal error is a failure of the daemon or of the host; its message
// names host paths (cgroup files, the state directory), commands and the
// daemon's own workings, which are not the client's business: the client
// gets only the kind and ref. Another error keeps its message but for the
// host paths of the operating system errors in its chain (a socket that
// cannot be dialed, a file that cannot be opened). Errors from inside a
// sandbox reach the daemon over the agent's wire as plain messages, so the
// paths they name are the sandbox's own and stay.
func Redact(err error) (out error, ref string) {
	if err == nil {
		return nil, ""
	}
	code := errdefs.Code(err)
	if code == errdefs.CodeInternal {
		ref = newRef()
		// A timeout or a cancellation stays one: clients tell them apart.
		for _, cause := range []error{context.DeadlineExceeded, context.Canceled} {
			if errors.Is(err, cause) {
				return fmt.Errorf("internal error (%w); the daemon logged its cause under error_ref=%s", cause, ref), ref
			}
		}
		return errdefs.Errorf(errdefs.ErrInternal, "internal error; the daemon logged its cause under error_ref=%s", ref), ref
	}
	paths := hostPaths(err, nil)
	if len(paths) == 0 {
		return err, ""
	}
	msg := err.Error()
	// The longest first, so that a path is not cut by a shorter one in it.
	slices.SortFunc(paths, func(a, b string) int { return len(b) - len(a) })
	for _, p := range paths {
		msg = strings.ReplaceAll(msg, p, HostPath)
	}
	ref = newRef()
	out = errdefs.FromCode(code, msg+" (error_ref="+ref+")")
	if d := errdefs.RetryAfter(err); d > 0 {
		out = errdefs.WithRetryAfter(out, d)
	}
	return out, ref
}

// hostPaths appends to paths the absolute paths that the operating system
// errors in err's tree name.
func hostPaths(err error, paths []string) []string {
	var named []string
	switch e := err.(type) {
	case *fs.PathError:
		named = []string{e.Path}
	case *os.LinkError:
		named = []string{e.Old, e.New}
	case *net.OpError:
		for _, a := range []net.Addr{e.Source, e.Addr} {
			if u, ok := a.(*net.UnixAddr); ok {
				named = append(named, u.Name)
			}
		}
	case *exec.Error:
		named = []string{e.Name}
	}
	for _, p := range named {
		if strings.HasPrefix(p, "/") {
			paths = append(paths, p)
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if next := u.Unwrap(); next != nil {
			paths = hostPaths(next, paths)
		}
	case interface{ Unwrap() []error }:
		for _, next := range u.Unwrap() {
			paths = hostPaths(next, paths)
		}
	}
	return paths
}

// ClientError is Redact for the client of r, about sandbox sandboxID (if
// any): what the client is not told goes to log, in full, under the
// reference the client is told.
func ClientError(log *slog.Logger, r *http.Request, sandboxID string, err error) error {
	out, ref := Redact(err)
	if ref != "" {
		level := slog.LevelWarn
		if errdefs.Code(err) == errdefs.CodeInternal {
			level = slog.LevelError
		}
		log.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path,
			"sandbox_id", sandboxID, "error_ref", ref, "error", err)
	}
	return out
}

func newRef() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
