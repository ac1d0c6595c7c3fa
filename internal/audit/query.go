package audit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Filter selects records; zero fields match everything.
type Filter struct {
	SandboxID string
	Key       string
	Tenant    string
	// Since and Until bound Record.Time: a record matches from Since on,
	// and before Until.
	Since, Until time.Time
	// Follow keeps the query going after the records already in the log,
	// delivering the ones appended next.
	Follow bool
}

func (f Filter) match(r Record) bool {
	switch {
	case f.SandboxID != "" && r.SandboxID != f.SandboxID,
		f.Key != "" && r.Key != f.Key,
		f.Tenant != "" && r.Tenant != f.Tenant,
		!f.Since.IsZero() && r.Time.Before(f.Since),
		!f.Until.IsZero() && !r.Time.Before(f.Until):
		return false
	}
	return true
}

// Query calls fn with each record that matches f, in the order they were
// appended: the rotated files from the oldest, then the current file. It
// stops at the first error of fn and returns it. Lines that are not whole
// records are passed over and counted (Skipped).
//
// Without f.Follow, Query returns nil after the last record appended
// before it reached the end of the current file. With f.Follow, it goes on
// delivering records as they are appended, across rotations, until ctx
// ends (it returns ctx's error) or the log is closed; a follower whose fn
// is so slow that more than Keep rotations pass before it reads a file
// gets an error wrapping errdefs.ErrResourceExhausted. A follower waits on
// a notification from Append, not by polling.
//
// Query reads the files without holding up appends; its cost is decoding
// every line of every file it reads, except rotated files last written
// before f.Since, which it passes over. Any number of queries may run at
// once, each holding up to Keep+1 open files.
func (l *Log) Query(ctx context.Context, f Filter, fn func(Record) error) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errClosed
	}
	older, cur, err := l.openFiles(l.opts.Keep)
	gen, changed, closed := l.gen, l.changed, false
	l.mu.Unlock()
	if err != nil {
		return err
	}
	t := &tail{file: cur}
	defer func() { t.file.Close() }()
	q := &query{l: l, ctx: ctx, f: f, fn: fn}
	if err := q.readFiles(older); err != nil {
		return err
	}
	for {
		if err := q.readTail(t); err != nil {
			return err
		}
		if !f.Follow {
			return nil
		}
		if closed {
			return errClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}

		l.mu.Lock()
		closed = l.closed
		var newer []*os.File
		var next *os.File
		var lost int
		if l.gen != gen {
			// The file t reads is FileName.<l.gen-gen> now, and the
			// ones rotated after it are numbered below that.
			moved := int(l.gen - gen - 1)
			lost = max(moved-l.opts.Keep, 0)
			newer, next, err = l.openFiles(moved - lost)
		}
		gen, changed = l.gen, l.changed
		l.mu.Unlock()
		if err != nil {
			return err
		}
		if next == nil {
			continue
		}
		// Nothing more is appended to t's file: read the rest of it, and
		// count a line it ends in the middle of as skipped.
		err = q.readTail(t)
		if err == nil && len(t.partial) > 0 {
			l.skipped.Add(1)
		}
		t.file.Close()
		t = &tail{file: next}
		if err == nil && lost > 0 {
			err = errdefs.Errorf(errdefs.ErrResourceExhausted, "following the audit log: %d files were rotated away before they were read", lost)
		}
		if err != nil {
			closeFiles(newer)
			return err
		}
		if err := q.readFiles(newer); err != nil {
			return err
		}
	}
}

// openFiles opens the rotated files n down to 1 that exist, oldest first,
// and the current file, which it creates if a failed rotation left none.
// l.mu is held, so that no rotation renames them in between.
func (l *Log) openFiles(n int) (rotated []*os.File, cur *os.File, err error) {
	for i := n; i >= 1; i-- {
		f, err := os.Open(l.name(i))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			closeFiles(rotated)
			return nil, nil, fmt.Errorf("opening audit log: %w", err)
		}
		rotated = append(rotated, f)
	}
	cur, err = os.OpenFile(l.name(0), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		closeFiles(rotated)
		return nil, nil, fmt.Errorf("opening audit log: %w", err)
	}
	return rotated, cur, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// query is one call of Query.
type query struct {
	l   *Log
	ctx context.Context
	f   Filter
	fn  func(Record) error
}

// readFiles reads rotated files to their ends, and closes them.
func (q *query) readFiles(files []*os.File) error {
	defer closeFiles(files)
	for _, file := range files {
		if !q.f.Since.IsZero() {
			// Every record of the file is older than its last write.
			if fi, err := file.Stat(); err == nil && fi.ModTime().Before(q.f.Since) {
				continue
			}
		}
		t := &tail{file: file}
		if err := q.readTail(t); err != nil {
			return err
		}
		if len(t.partial) > 0 {
			q.l.skipped.Add(1)
		}
	}
	return nil
}

// readTail delivers the whole lines that t's file holds now.
func (q *query) readTail(t *tail) error {
	for {
		line, err := t.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading audit log: %w", err)
		}
		if err := q.ctx.Err(); err != nil {
			return err
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			q.l.skipped.Add(1)
			continue
		}
		if !q.f.match(r) {
			continue
		}
		if err := q.fn(r); err != nil {
			return err
		}
	}
}

// tail reads the lines of a file that may still grow. A line the file
// does not end yet waits in partial: it may be a write in progress, or the
// part of a line that a failed write left.
type tail struct {
	file    *os.File
	r       *bufio.Reader
	partial []byte
}

// next returns the next whole line without its newline, or io.EOF when
// the file holds no further newline now.
func (t *tail) next() ([]byte, error) {
	if t.r == nil {
		t.r = bufio.NewReaderSize(t.file, 64<<10)
	}
	b, err := t.r.ReadBytes('\n')
	if err != nil {
		t.partial = append(t.partial, b...)
		return nil, err
	}
	if len(t.partial) > 0 {
		b = append(t.partial, b...)
		t.partial = nil
	}
	return b[:len(b)-1], nil
}
