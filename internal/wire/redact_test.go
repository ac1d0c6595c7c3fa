package wire

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestRedact(t *testing.T) {
	link := &os.LinkError{Op: "rename", Old: "/var/lib/corral/a", New: "/var/lib/corral/b", Err: fs.ErrExist}
	tests := []struct {
		name    string
		err     error
		want    string // the message the client gets, "" for a reference
		kind    error
		hidden  bool // the message is only the kind and a reference
		retryIn time.Duration
	}{
		{name: "nil"},
		{name: "plain", err: errdefs.Errorf(errdefs.ErrNotFound, "open /etc/x: no such file"), want: "open /etc/x: no such file", kind: errdefs.ErrNotFound},
		{name: "internal", err: fmt.Errorf("reading %s: %w", "/srv/state.db", errors.New("disk I/O error")), kind: errdefs.ErrInternal, hidden: true},
		{name: "internal timeout", err: fmt.Errorf("waiting at /run/x.sock: %w", context.DeadlineExceeded), kind: context.DeadlineExceeded, hidden: true},
		{name: "link error in a join", err: fmt.Errorf("moving: %w", errors.Join(errdefs.ErrFailedPrecondition, link)),
			want: "moving: failed precondition\nrename " + HostPath + " " + HostPath + ": file already exists", kind: errdefs.ErrFailedPrecondition},
		{name: "missing binary, with a retry hint", err: errdefs.WithRetryAfter(fmt.Errorf("starting: %w", errors.Join(errdefs.ErrUnavailable,
			&exec.Error{Name: "/usr/sbin/runc", Err: exec.ErrNotFound})), 2*time.Second),
			want: "starting: unavailable\nexec: \"" + HostPath + "\": executable file not found in $PATH", kind: errdefs.ErrUnavailable, retryIn: 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ref := Redact(tt.err)
			if tt.err == nil {
				if got != nil || ref != "" {
					t.Fatalf("Redact(nil) = %v, %q", got, ref)
				}
				return
			}
			if !errors.Is(got, tt.kind) {
				t.Errorf("Redact = %v, not of kind %v", got, tt.kind)
			}
			if d := errdefs.RetryAfter(got); d != tt.retryIn {
				t.Errorf("retry hint %v, want %v", d, tt.retryIn)
			}
			msg := got.Error()
			switch {
			case tt.hidden:
				if ref == "" || !strings.HasPrefix(msg, "internal error") || !strings.HasSuffix(msg, "error_ref="+ref) {
					t.Errorf("Redact = %q, ref %q; want the kind and the reference only", msg, ref)
				}
			case tt.want == tt.err.Error():
				if ref != "" || got != tt.err {
					t.Errorf("Redact changed an error without host paths: %q, ref %q", msg, ref)
				}
			default:
				if ref == "" || msg != tt.want+" (error_ref="+ref+")" {
					t.Errorf("Redact = %q, ref %q; want %q and a reference", msg, ref, tt.want)
				}
			}
		})
	}
}
