package agentserver

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

const (
	// maxWatches bounds the directories one watch stream follows: each is
	// an inotify watch, about 1 KiB of kernel memory, and the limit is per
	// user across the sandbox.
	maxWatches = 8192
	// watchMask is what is watched on every directory.
	watchMask = unix.IN_CREATE | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_DELETE |
		unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB |
		unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
)

// handleWatch serves GET /files/watch?path=P&recursive=B: NDJSON
// wire.WatchEvents for changes in directory P (and, recursively, in every
// directory below it, including ones created later) until the client
// leaves, the agent closes, or P itself is removed or moved away (the
// stream then ends after reporting it).
//
// Events of one read from the kernel go out together: consecutive write
// events for one path among them are reported once, and a rename within
// the watched tree is one "rename" event with OldPath set (a renamed
// directory keeps its watches); a rename whose other half is outside the
// tree is "rename" with only Path (moved away) or "create" (moved in). A
// directory created or moved in under a recursive watch is scanned when
// its watch is added, and what is already in it is reported as "create":
// entries created meanwhile may be reported twice, but none is missed. "overflow" means events were lost (the kernel's queue
// overflowed while the client read slowly, or a new directory could not
// be watched): rescan.
//
// Cost: one inotify instance and one watch per directory, at most
// maxWatches (more is resource_exhausted when the stream starts); the
// handler's goroutine reads the inotify descriptor, which is non-blocking
// and closed when the stream ends, so nothing outlives the request.
func (s *Server) handleWatch(w http.ResponseWriter, r *http.Request) {
	fsys, p, err := s.fileRequest(r)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			wire.WriteError(w, errorf(errdefs.ErrInvalidArgument, "invalid recursive value %q", v))
			return
		}
	}
	ctx, untrack := s.trackStream(r.Context())
	defer untrack()

	wt, err := newWatcher(fsys, p, recursive)
	if err != nil {
		wire.WriteError(w, err)
		return
	}
	defer wt.f.Close()
	// Closing the descriptor wakes the read below when the stream must end.
	stop := afterFunc(ctx, func() { wt.f.Close() })
	defer stop()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	enc := jsonEncoder(w)
	buf := make([]byte, 64<<10)
	for {
		n, err := wt.f.Read(buf)
		if err != nil {
			return // closed because the stream ends, or a broken instance
		}
		events, ended := wt.decode(buf[:n], time.Now().UTC())
		for _, ev := range events {
			if enc.Encode(ev) != nil {
				return
			}
		}
		if rc.Flush() != nil || ended {
			return
		}
	}
}

// watcher maps one inotify instance's watches to sandbox paths.
type watcher struct {
	fsys      fileSystem
	f         *os.File // the inotify instance
	root      string
	rootWD    int32
	recursive bool
	dirs      map[int32]string // watch descriptor -> directory
}

// newWatcher creates the inotify instance and watches root (and, when
// recursive, every directory below it).
func newWatcher(fsys fileSystem, root string, recursive bool) (_ *watcher, err error) {
	fi, err := fsys.Lstat(root)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		fi, err = statFollow(fsys, root)
	}
	if err != nil {
		return nil, fsError("watching "+root, err)
	}
	if !fi.IsDir() {
		return nil, errorf(errdefs.ErrFailedPrecondition, "watching %s: not a directory", root)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		if err == syscall.EMFILE || err == syscall.ENFILE {
			return nil, errorf(errdefs.ErrResourceExhausted, "watching %s: too many inotify instances: %s", root, errnoText(err))
		}
		return nil, errorf(errdefs.ErrInternal, "watching %s: creating inotify instance: %s", root, errnoText(err))
	}
	// Non-blocking, so the runtime's poller waits for it and Close wakes
	// a pending Read.
	wt := &watcher{fsys: fsys, f: os.NewFile(uintptr(fd), "inotify"), root: root, recursive: recursive, dirs: make(map[int32]string)}
	defer func() {
		if err != nil {
			wt.f.Close()
		}
	}()
	wd, err := wt.add(root)
	if err != nil {
		return nil, watchError(root, err)
	}
	wt.rootWD = wd
	if recursive {
		if err := wt.addBelow(root, nil); err != nil {
			return nil, watchError(root, err)
		}
	}
	return wt, nil
}

// statFollow stats name following symbolic links (inside Root).
func statFollow(fsys fileSystem, name string) (os.FileInfo, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Stat()
}

// errTooManyWatches is returned by add when maxWatches is reached.
var errTooManyWatches = errors.New("too many directories to watch")

func watchError(root string, err error) error {
	switch {
	case errors.Is(err, errTooManyWatches):
		return errorf(errdefs.ErrResourceExhausted, "watching %s: more than %d directories: watch a smaller tree", root, maxWatches)
	case errors.Is(err, syscall.ENOSPC):
		return errorf(errdefs.ErrResourceExhausted, "watching %s: the sandbox's inotify watch limit is reached", root)
	default:
		return fsError("watching "+root, err)
	}
}

// add watches directory dir and returns its watch descriptor.
func (wt *watcher) add(dir string) (int32, error) {
	if len(wt.dirs) >= maxWatches {
		return 0, errTooManyWatches
	}
	target, release, err := wt.fsys.PinDir(dir)
	if err != nil {
		return 0, err
	}
	defer release()
	rc, err := wt.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var wd int
	var addErr error
	// Control keeps the descriptor from being closed (and its number
	// reused) while the call runs.
	if err := rc.Control(func(fd uintptr) { wd, addErr = unix.InotifyAddWatch(int(fd), target, watchMask) }); err != nil {
		return 0, err
	}
	if addErr != nil {
		return 0, addErr
	}
	wt.dirs[int32(wd)] = dir
	return int32(wd), nil
}

// addBelow watches every directory below dir. With found, everything
// below dir is also reported into it as created.
func (wt *watcher) addBelow(dir string, found *[]wire.WatchEvent) error {
	d, err := wt.fsys.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, e := range entries {
		child := path.Join(dir, e.Name())
		if found != nil {
			*found = append(*found, wire.WatchEvent{Type: wire.WatchCreate, Path: child, IsDir: e.IsDir()})
		}
		if !e.IsDir() {
			continue
		}
		if _, err := wt.add(child); err != nil {
			if gone(err) {
				continue // removed or replaced since it was listed
			}
			return err
		}
		if err := wt.addBelow(child, found); err != nil && !gone(err) {
			return err
		}
	}
	return nil
}

// addTree watches a directory that appeared below the root (created or
// moved in), and what is below it, which is reported as created: it may
// have changed before the watches were in place. A failure is reported as
// an overflow event: some changes will be missed.
func (wt *watcher) addTree(dir string, out *[]wire.WatchEvent, now time.Time) {
	var found []wire.WatchEvent
	err := func() error {
		if _, err := wt.add(dir); err != nil {
			return err
		}
		return wt.addBelow(dir, &found)
	}()
	for i := range found {
		found[i].Time = now
	}
	*out = append(*out, found...)
	if err != nil && !gone(err) {
		*out = append(*out, wire.WatchEvent{Type: wire.WatchOverflow, Path: dir, Time: now})
	}
}

// renameTree gives the watches of dir and the directories below it their
// names under newDir.
func (wt *watcher) renameTree(dir, newDir string) {
	for wd, d := range wt.dirs {
		if d == dir || strings.HasPrefix(d, dir+"/") {
			wt.dirs[wd] = newDir + d[len(dir):]
		}
	}
}

// forgetTree drops the watches of dir and every directory below it, which
// left the tree.
func (wt *watcher) forgetTree(dir string) {
	rc, err := wt.f.SyscallConn()
	if err != nil {
		return
	}
	for wd, d := range wt.dirs {
		if d == dir || strings.HasPrefix(d, dir+"/") {
			delete(wt.dirs, wd)
			_ = rc.Control(func(fd uintptr) { _, _ = unix.InotifyRmWatch(int(fd), uint32(wd)) })
		}
	}
}
