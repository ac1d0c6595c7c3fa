package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Record is one entry of the audit log, stored as one line of JSON.
//
// Fields may be added; none is renamed or changes meaning. A new field is
// optional (omitempty), so that the records written before it still read,
// and readers ignore the fields they do not know.
type Record struct {
	// Time is when the call or command happened, in UTC; Append sets it to
	// the current time when it is zero. It is never later than the Append
	// that stores it: a query with Filter.Since passes over rotated files
	// last written before Since.
	Time time.Time `json:"time"`
	// Tenant and Key name who made the call: the tenant and the name of
	// its API key.
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	// Action is the API call as "METHOD /path" (e.g. "POST /v1/sandboxes"),
	// or the kind of command started in a sandbox: "exec", "process",
	// "pty" or "code".
	Action    string `json:"action"`
	SandboxID string `json:"sandbox_id"`
	// Status is the HTTP status the call was answered with.
	Status int `json:"status,omitempty"`
	// Argv is the command started; CodeSHA256 the SHA-256, in hex, of the
	// code a "code" action ran.
	Argv       []string `json:"argv,omitempty"`
	CodeSHA256 string   `json:"code_sha256,omitempty"`
	// ExitCode and Signal say how the command ended, when it did.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// DurationMS is how long the call or command took, in milliseconds.
	DurationMS float64 `json:"duration_ms,omitempty"`
	// Error is why the call failed.
	Error string `json:"error,omitempty"`
	// Detail holds what else an action wants on record.
	Detail map[string]string `json:"detail,omitempty"`
}

// Options tune a Log; zero fields take the defaults.
type Options struct {
	// MaxBytes is the size the current file may reach: an Append that
	// would take it past MaxBytes rotates first (default 64 MiB). A record
	// longer than MaxBytes gets a file of its own.
	MaxBytes int64
	// Keep is how many rotated files are kept (default 8).
	Keep int
}

// Defaults of Options.
const (
	DefaultMaxBytes = 64 << 20
	DefaultKeep     = 8
)

// FileName is the name of the current file in the log's directory; the
// rotated ones are FileName.1 (the newest) to FileName.Keep.
const FileName = "audit.log"

// fragmentEnd is written before the next record after a write that left
// part of a line in the file: the "!" makes the fragment fail to parse
// even if only its newline was missing, so that a record whose Append
// failed never reads as written, and the newline starts the next record
// on a line of its own.
const fragmentEnd = "!\n"

// Log is an audit log open for appending and querying. It is safe for
// concurrent use.
type Log struct {
	dir  string
	opts Options
	// write writes p to f; tests replace it to make writes fail.
	write func(f *os.File, p []byte) (int, error)

	skipped atomic.Int64

	mu     sync.Mutex
	f      *os.File // the current file, O_APPEND; nil after a failed reopen
	size   int64    // of the current file
	broken bool     // the current file ends with part of a line
	closed bool
	// gen counts rotations, so that a follower knows how many files
	// moved since it opened its current one.
	gen uint64
	// changed is closed, and replaced, when the log changes: after each
	// write and rotation, and at Close.
	changed chan struct{}
}

// Open opens the audit log in dir, creating dir (0700) and the current
// file (0600) if they are missing; appending continues the current file.
// Rotated files numbered above opts.Keep, left by a run that kept more,
// are removed.
func Open(dir string, opts Options) (*Log, error) {
	if opts.MaxBytes < 0 || opts.Keep < 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "audit log options %+v: sizes and counts must not be negative", opts)
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Keep == 0 {
		opts.Keep = DefaultKeep
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating audit log directory: %w", err)
	}
	l := &Log{dir: dir, opts: opts, write: (*os.File).Write, changed: make(chan struct{})}
	for i := opts.Keep + 1; ; i++ {
		if err := os.Remove(l.name(i)); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			return nil, fmt.Errorf("removing an old audit log file: %w", err)
		}
	}
	if err := l.openCurrent(); err != nil {
		return nil, err
	}
	return l, nil
}

// name returns the path of the current file (i == 0) or of rotated file i.
func (l *Log) name(i int) string {
	p := filepath.Join(l.dir, FileName)
	if i > 0 {
		p += "." + strconv.Itoa(i)
	}
	return p
}

// openCurrent opens the current file for appending and finds whether a
// failed write left part of a line at its end. l.mu is held, or l is not
// shared yet.
func (l *Log) openCurrent() error {
	f, err := os.OpenFile(l.name(0), os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening audit log: %w: %w", err, errdefs.ErrUnavailable)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening audit log: %w: %w", err, errdefs.ErrUnavailable)
	}
	broken := false
	if fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err != nil {
			f.Close()
			return fmt.Errorf("reading the end of the audit log: %w: %w", err, errdefs.ErrUnavailable)
		}
		broken = last[0] != '\n'
	}
	l.f, l.size, l.broken = f, fi.Size(), broken
	return nil
}

// errClosed is what calls on a closed Log return.
var errClosed = errdefs.Errorf(errdefs.ErrUnavailable, "the audit log is closed")

// Append writes r as one line at the end of the log, rotating first when
// the line would take the current file past Options.MaxBytes. When it
// returns nil the line is in the file, safe from a crash of the daemon
// but not from a power loss (see the package documentation).
//
// An error wraps errdefs.ErrUnavailable when the log could not take r: it
// is closed, or the write failed, and the error wraps the system's too
// (ENOSPC when the disk is full); r is then missing, or part of a line
// that readers skip. It wraps errdefs.ErrInternal when r cannot be encoded
// (a duration that is not a number).
//
// Appends are serialized: each costs one write(2), and a rotation Keep+1
// renames more.
func (l *Log) Append(r Record) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding audit record: %w: %w", err, errdefs.ErrInternal)
	}
	line = append(line, '\n')

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	need := int64(len(line))
	if l.broken {
		need += int64(len(fragmentEnd))
	}
	if l.f != nil && l.size > 0 && l.size+need > l.opts.MaxBytes {
		if err := l.rotate(); err != nil {
			return err
		}
	}
	if l.f == nil {
		if err := l.openCurrent(); err != nil {
			return err
		}
	}
	if l.broken {
		line = append([]byte(fragmentEnd), line...)
	}
	n, err := l.write(l.f, line)
	if n > 0 {
		l.size += int64(n)
		l.broken = line[n-1] != '\n'
		l.notify()
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return fmt.Errorf("appending to the audit log: disk full: %w: %w", err, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("appending to the audit log: %w: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// rotate renames the current file to FileName.1, after shifting the
// rotated ones up and dropping the oldest, and opens a new current file.
// A reader that has a file open keeps reading it under its new name.
// l.mu is held.
func (l *Log) rotate() error {
	if err := os.Remove(l.name(l.opts.Keep)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("rotating the audit log: %w: %w", err, errdefs.ErrUnavailable)
	}
	for i := l.opts.Keep - 1; i >= 0; i-- {
		if err := os.Rename(l.name(i), l.name(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating the audit log: %w: %w", err, errdefs.ErrUnavailable)
		}
	}
	// The old file is FileName.1 now: whatever happens next, appends must
	// not go on into it.
	l.f.Close()
	l.f, l.size, l.broken = nil, 0, false
	l.gen++
	l.notify()
	return l.openCurrent()
}

// notify wakes the followers. l.mu is held.
func (l *Log) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Skipped returns how many lines queries have passed over because they
// were not whole records (parts of lines that a failed write left, or
// damage to the files), since Open. A line is counted by every query that
// reads it.
func (l *Log) Skipped() int64 { return l.skipped.Load() }

// Close closes the log: Append and Query fail from now on, and followers
// return once they have delivered what was appended before. Closing a
// closed Log does nothing.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.changed)
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
