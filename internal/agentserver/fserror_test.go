package agentserver

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

// fsError gives each failure the kind that tells a client whether to try
// again: only the agent shutting down is unavailable; a file that cannot
// be read or written is not. The message names the sandbox path only.
func TestFSErrorKinds(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"missing", syscall.ENOENT, errdefs.ErrNotFound},
		{"unreadable memory", syscall.EIO, errdefs.ErrFailedPrecondition},
		{"operation not supported by the file system", syscall.EOPNOTSUPP, errdefs.ErrFailedPrecondition},
		{"too many links", syscall.EMLINK, errdefs.ErrResourceExhausted},
		{"agent out of descriptors", syscall.EMFILE, errdefs.ErrResourceExhausted},
		{"system out of descriptors", syscall.ENFILE, errdefs.ErrResourceExhausted},
		{"read-only", syscall.EROFS, errdefs.ErrPermissionDenied},
		{"bad offset", syscall.EINVAL, errdefs.ErrInvalidArgument},
		{"root closed by shutdown", os.ErrClosed, errdefs.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fsError("reading /f", &fs.PathError{Op: "read", Path: "/host/root/f", Err: tt.err})
			if !errors.Is(err, tt.want) {
				t.Errorf("fsError(%v) = %v, want kind %v", tt.err, err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "reading /f: ") || strings.Contains(err.Error(), "/host") {
				t.Errorf("message %q, want the action and the reason only", err)
			}
		})
	}
}
