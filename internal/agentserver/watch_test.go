package agentserver_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// watchStream runs a Watch in the background.
type watchStream struct {
	events chan wire.WatchEvent
	cancel context.CancelFunc
	done   chan error
}

// startWatch watches path and returns once the watch is in place: it
// creates probe files in the watched directory until one is reported.
func startWatch(t *testing.T, a *testAgent, path string, recursive bool) *watchStream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &watchStream{events: make(chan wire.WatchEvent, 1024), cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- a.client.Watch(ctx, path, recursive, func(ev wire.WatchEvent) error {
			select {
			case w.events <- ev:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	probe := filepath.Join(a.root, path, ".probe")
	for i := 0; ; i++ {
		if i == 500 {
			t.Fatal("watch never reported the probe file")
		}
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-w.events:
			if strings.HasSuffix(ev.Path, "/.probe") {
				os.Remove(probe)
				w.drain(100 * time.Millisecond)
				return w
			}
		case err := <-w.done:
			t.Fatalf("watch ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// drain discards events until none arrives for quiet.
func (w *watchStream) drain(quiet time.Duration) {
	for {
		select {
		case <-w.events:
		case <-time.After(quiet):
			return
		}
	}
}

// expect waits for an event matching want (Time ignored) and fails the
// test after a while, listing what arrived instead.
func (w *watchStream) expect(t *testing.T, want wire.WatchEvent) {
	t.Helper()
	var seen []string
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-w.events:
			if ev.Time.IsZero() {
				t.Errorf("event without time: %+v", ev)
			}
			ev.Time = time.Time{}
			if ev == want {
				return
			}
			seen = append(seen, fmt.Sprintf("%+v", ev))
		case <-timeout:
			t.Fatalf("no event %+v; saw %s", want, strings.Join(seen, ", "))
		}
	}
}

func TestWatch(t *testing.T) {
	a := startAgent(t)
	host := func(p string) string { return filepath.Join(a.root, p) }
	if err := os.Mkdir(host("w"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(host("w/old/deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, a, "/w", true)
	ev := func(typ, path string, isDir bool) wire.WatchEvent {
		return wire.WatchEvent{Type: typ, Path: path, IsDir: isDir}
	}

	steps := []struct {
		name string
		do   func() error
		want []wire.WatchEvent
	}{
		{
			name: "directory created after the watch started",
			do:   func() error { return os.Mkdir(host("w/sub"), 0o755) },
			want: []wire.WatchEvent{ev(wire.WatchCreate, "/w/sub", true)},
		},
		{
			name: "create and write in it",
			do:   func() error { return os.WriteFile(host("w/sub/f"), []byte("data"), 0o644) },
			want: []wire.WatchEvent{ev(wire.WatchCreate, "/w/sub/f", false), ev(wire.WatchWrite, "/w/sub/f", false)},
		},
		{
			name: "rename within",
			do:   func() error { return os.Rename(host("w/sub/f"), host("w/sub/g")) },
			want: []wire.WatchEvent{{Type: wire.WatchRename, Path: "/w/sub/g", OldPath: "/w/sub/f"}},
		},
		{
			name: "chmod",
			do:   func() error { return os.Chmod(host("w/sub/g"), 0o600) },
			want: []wire.WatchEvent{ev(wire.WatchChmod, "/w/sub/g", false)},
		},
		{
			name: "remove",
			do:   func() error { return os.Remove(host("w/sub/g")) },
			want: []wire.WatchEvent{ev(wire.WatchRemove, "/w/sub/g", false)},
		},
		{
			name: "existing directory below",
			do:   func() error { return os.WriteFile(host("w/old/deeper/x"), nil, 0o644) },
			want: []wire.WatchEvent{ev(wire.WatchCreate, "/w/old/deeper/x", false)},
		},
		{
			name: "renamed directory is watched under its new name",
			do: func() error {
				if err := os.Rename(host("w/old"), host("w/new")); err != nil {
					return err
				}
				return os.WriteFile(host("w/new/deeper/y"), nil, 0o644)
			},
			want: []wire.WatchEvent{
				{Type: wire.WatchRename, Path: "/w/new", OldPath: "/w/old", IsDir: true},
				ev(wire.WatchCreate, "/w/new/deeper/y", false),
			},
		},
		{
			name: "tree created at once",
			do:   func() error { return os.MkdirAll(host("w/t1/t2/t3"), 0o755) },
			want: []wire.WatchEvent{ev(wire.WatchCreate, "/w/t1", true), ev(wire.WatchCreate, "/w/t1/t2/t3", true)},
		},
		{
			name: "moved out",
			do:   func() error { return os.Rename(host("w/t1"), host("gone")) },
			want: []wire.WatchEvent{ev(wire.WatchRename, "/w/t1", true)},
		},
		{
			name: "moved in",
			do:   func() error { return os.Rename(host("gone"), host("w/back")) },
			want: []wire.WatchEvent{ev(wire.WatchCreate, "/w/back", true)},
		},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		for _, want := range st.want {
			w.expect(t, want)
		}
	}

	// The watched directory's removal ends the stream.
	if err := os.RemoveAll(host("w")); err != nil {
		t.Fatal(err)
	}
	w.expect(t, ev(wire.WatchRemove, "/w", true))
	select {
	case err := <-w.done:
		if err != nil {
			t.Fatalf("watch ended with %v, want nil", err)
		}
		w.done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end after its directory was removed")
	}
}

func TestWatchNonRecursive(t *testing.T) {
	a := startAgent(t)
	if err := os.MkdirAll(filepath.Join(a.root, "w", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, a, "/w", false)
	if err := os.WriteFile(filepath.Join(a.root, "w", "sub", "hidden"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.root, "w", "seen"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w.expect(t, wire.WatchEvent{Type: wire.WatchCreate, Path: "/w/seen"})
	select {
	case ev := <-w.events:
		if strings.Contains(ev.Path, "hidden") {
			t.Fatalf("non-recursive watch reported %+v", ev)
		}
	default:
	}
}

// inotifyFDs counts this process's open inotify instances.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// A client that leaves ends the stream on the agent: the inotify instance
// is closed (and goleak finds no reader left).
func TestWatchClientLeaves(t *testing.T) {
	a := startAgent(t)
	if err := os.Mkdir(filepath.Join(a.root, "w"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := inotifyFDs(t)
	w := startWatch(t, a, "/w", true)
	if inotifyFDs(t) != before+1 {
		t.Fatalf("inotify instances: %d, want %d", inotifyFDs(t), before+1)
	}
	w.cancel()
	if err := <-w.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch: %v, want canceled", err)
	}
	w.done <- nil
	deadline := time.Now().Add(5 * time.Second)
	for inotifyFDs(t) != before {
		if time.Now().After(deadline) {
			t.Fatalf("inotify instance still open after the client left")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close ends watch streams.
func TestWatchEndsOnClose(t *testing.T) {
	a := startAgent(t)
	if err := os.Mkdir(filepath.Join(a.root, "w"), 0o755); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, a, "/w", false)
	a.srv.Close()
	select {
	case err := <-w.done:
		if err != nil {
			t.Fatalf("Watch: %v, want nil", err)
		}
		w.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end on Close")
	}
}

func TestWatchErrors(t *testing.T) {
	a := startAgent(t)
	if err := os.WriteFile(filepath.Join(a.root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..", filepath.Join(a.root, "up")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path      string
		recursive bool
		want      error
	}{
		{"/missing", true, errdefs.ErrNotFound},
		{"/file", true, errdefs.ErrFailedPrecondition},
		{"/up", true, errdefs.ErrPermissionDenied},
		{"relative", true, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			err := a.client.Watch(t.Context(), tt.path, tt.recursive, func(wire.WatchEvent) error { return nil })
			if !errors.Is(err, tt.want) {
				t.Fatalf("Watch: %v, want %v", err, tt.want)
			}
		})
	}
}

// A tree with more directories than one stream may watch is refused.
func TestWatchLimit(t *testing.T) {
	// 8200 directories take seconds on a disk; tmpfs is much faster.
	root, err := os.MkdirTemp("/dev/shm", "agentd-watch-")
	if err != nil {
		root = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(root) })
	}
	a := startAgentWith(t, agentserver.Options{Root: root})
	for i := range 82 {
		parent := filepath.Join(root, fmt.Sprint(i))
		if err := os.Mkdir(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 100 {
			if err := os.Mkdir(filepath.Join(parent, fmt.Sprint(j)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = a.client.Watch(t.Context(), "/", true, func(wire.WatchEvent) error { return nil })
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "8192") {
		t.Fatalf("Watch: %v, want resource exhausted naming the limit", err)
	}
	// Without recursion one watch is enough.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := a.client.Watch(ctx, "/", false, func(wire.WatchEvent) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("non-recursive Watch: %v, want it to run until the deadline", err)
	}
}
