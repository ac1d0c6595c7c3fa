// Package errdefs defines the small closed set of error kinds that Corral's
// layers share. Callers test kinds with errors.Is; only internal/server turns
// kinds into HTTP statuses, and only the wire packages turn codes back into
// kinds.
package errdefs

import (
	"errors"
	"fmt"
	"time"
)

// The error kinds. Wrap them with fmt.Errorf("...: %w", ErrNotFound) or use
// the helper constructors below.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	// ErrBusy means the server as a whole is at capacity (as opposed to
	// ErrResourceExhausted, a limit of the caller's own): the same request
	// may succeed later.
	ErrBusy             = errors.New("busy")
	ErrUnavailable      = errors.New("unavailable")
	ErrUnauthenticated  = errors.New("unauthenticated")
	ErrPermissionDenied = errors.New("permission denied")
	ErrNotImplemented   = errors.New("not implemented")
	ErrInternal         = errors.New("internal")
)

// Codes are the machine-readable names of the kinds, as they appear in API
// error bodies: {"error":{"code":"not_found","message":"..."}}.
const (
	CodeInvalidArgument    = "invalid_argument"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeFailedPrecondition = "failed_precondition"
	CodeResourceExhausted  = "resource_exhausted"
	CodeBusy               = "busy"
	CodeUnavailable        = "unavailable"
	CodeUnauthenticated    = "unauthenticated"
	CodePermissionDenied   = "permission_denied"
	CodeNotImplemented     = "not_implemented"
	CodeInternal           = "internal"
)

var kinds = []struct {
	err  error
	code string
}{
	{ErrInvalidArgument, CodeInvalidArgument},
	{ErrNotFound, CodeNotFound},
	{ErrAlreadyExists, CodeAlreadyExists},
	{ErrFailedPrecondition, CodeFailedPrecondition},
	{ErrResourceExhausted, CodeResourceExhausted},
	{ErrBusy, CodeBusy},
	{ErrUnavailable, CodeUnavailable},
	{ErrUnauthenticated, CodeUnauthenticated},
	{ErrPermissionDenied, CodePermissionDenied},
	{ErrNotImplemented, CodeNotImplemented},
	{ErrInternal, CodeInternal},
}

// Code returns the code of the first kind that err wraps, or "internal".
func Code(err error) string {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.code
		}
	}
	return CodeInternal
}

// FromCode returns an error of the kind named by code carrying message, so
// that an error that crossed a wire can be tested with errors.Is again.
// Unknown codes become ErrInternal.
func FromCode(code, message string) error {
	for _, k := range kinds {
		if k.code == code {
			return &codedError{kind: k.err, msg: message}
		}
	}
	return &codedError{kind: ErrInternal, msg: message}
}

type codedError struct {
	kind error
	msg  string
}

func (e *codedError) Error() string { return e.msg }
func (e *codedError) Unwrap() error { return e.kind }

// Errorf formats a message and marks it with kind, for errors that originate
// in Corral rather than wrap a lower error.
func Errorf(kind error, format string, args ...any) error {
	return &codedError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// WithRetryAfter marks err with a hint of when the same request may
// succeed; the API sends it as a Retry-After header. err keeps its kind.
func WithRetryAfter(err error, d time.Duration) error {
	return &retryError{err: err, after: d}
}

// RetryAfter returns the hint WithRetryAfter attached to err, or 0.
func RetryAfter(err error) time.Duration {
	var r *retryError
	if errors.As(err, &r) {
		return r.after
	}
	return 0
}

type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }
