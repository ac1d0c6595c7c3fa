package e2b

import (
	"context"
	"errors"
	"io/fs"
	"net/http/httptrace"
	"path"
	"strconv"
	"sync"

	"github.com/corralrun/corral/internal/agent"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// This file serves E2B's filesystem.Filesystem service on the agent's file
// API. Paths may be relative to the user's home directory, as in envd.

// maxListEntries bounds one ListDir answer, which is built in memory.
const maxListEntries = 1 << 17

// entryOf converts the agent's file description to E2B's: mode is the
// permission bits, permissions their "ls -l" form, owner and group names
// ("root" for ID 0, the number otherwise: Corral does not read the
// sandbox's user database for listings).
func entryOf(fi wire.FileInfo) entryInfo {
	mode := fs.FileMode(fi.Mode & 0o777)
	if fi.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if fi.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if fi.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	t := fileTypeUnspecified
	switch fi.Type {
	case wire.FileTypeFile:
		t = fileTypeFile
	case wire.FileTypeDir:
		t, mode = fileTypeDirectory, mode|fs.ModeDir
	case wire.FileTypeSymlink:
		t, mode = fileTypeSymlink, mode|fs.ModeSymlink
	default:
		mode |= fs.ModeIrregular
	}
	e := entryInfo{Name: fi.Name, Type: t, Path: fi.Path, Size: fi.Size, Mode: fi.Mode & 0o777,
		Permissions: mode.String(), Owner: idName(fi.UID), Group: idName(fi.GID)}
	if !fi.ModTime.IsZero() {
		e.ModifiedTime = timestampOf(fi.ModTime)
	}
	if fi.Type == wire.FileTypeSymlink {
		target := fi.Target
		e.SymlinkTarget = &target
	}
	return e
}

func idName(id int) string {
	if id == 0 {
		return "root"
	}
	return strconv.Itoa(id)
}

func (s *Server) fsStat(ctx context.Context, c *call) (response, error) {
	var req pathRequest
	cl, err := s.decodeFor(c, &req)
	if err != nil {
		return nil, err
	}
	fi, err := cl.Stat(ctx, resolvePath(req.Path, userOf(c.header)))
	if err != nil {
		return nil, err
	}
	return entryResponse{Entry: entryOf(fi)}, nil
}

// fsMakeDir creates a directory and its missing parents. As in envd, an
// existing directory is already_exists (the SDK's makeDir then returns
// false) and an existing file is invalid_argument.
func (s *Server) fsMakeDir(ctx context.Context, c *call) (response, error) {
	var req pathRequest
	cl, err := s.decodeFor(c, &req)
	if err != nil {
		return nil, err
	}
	p := resolvePath(req.Path, userOf(c.header))
	switch fi, err := cl.Stat(ctx, p); {
	case err == nil && fi.Type == wire.FileTypeDir:
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "directory already exists: %s", p)
	case err == nil:
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "path already exists but it is not a directory: %s", p)
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	}
	fi, err := cl.Mkdir(ctx, wire.MkdirRequest{Path: p, Parents: true, Mode: 0o755})
	if err != nil {
		return nil, err
	}
	return entryResponse{Entry: entryOf(fi)}, nil
}

func (s *Server) fsMove(ctx context.Context, c *call) (response, error) {
	var req moveRequest
	cl, err := s.decodeFor(c, &req)
	if err != nil {
		return nil, err
	}
	user := userOf(c.header)
	fi, err := cl.Rename(ctx, resolvePath(req.Source, user), resolvePath(req.Destination, user))
	if err != nil {
		return nil, err
	}
	return entryResponse{Entry: entryOf(fi)}, nil
}

// fsListDir lists a directory to the given depth (1: its entries only).
func (s *Server) fsListDir(ctx context.Context, c *call) (response, error) {
	var req listDirRequest
	cl, err := s.decodeFor(c, &req)
	if err != nil {
		return nil, err
	}
	depth := int(req.Depth)
	if depth == 0 {
		depth = 1
	}
	out := listDirResponse{Entries: []entryInfo{}}
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		infos, err := cl.List(ctx, dir)
		if err != nil {
			return err
		}
		for _, fi := range infos {
			if len(out.Entries) >= maxListEntries {
				return errdefs.Errorf(errdefs.ErrResourceExhausted, "listing has more than %d entries: list with a smaller depth", maxListEntries)
			}
			out.Entries = append(out.Entries, entryOf(fi))
			if depth > 1 && fi.Type == wire.FileTypeDir {
				if err := walk(fi.Path, depth-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(resolvePath(req.Path, userOf(c.header)), depth); err != nil {
		return nil, err
	}
	return out, nil
}

// fsRemove removes a file or a directory tree. A path that does not exist
// is not an error, as with envd's os.RemoveAll.
func (s *Server) fsRemove(ctx context.Context, c *call) (response, error) {
	var req pathRequest
	cl, err := s.decodeFor(c, &req)
	if err != nil {
		return nil, err
	}
	if err := cl.Remove(ctx, resolvePath(req.Path, userOf(c.header)), true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	return empty{}, nil
}

// fsWatchDir streams the changes in a directory: a start event once the
// watch is in place, then one event per change, with keepalives.
func (s *Server) fsWatchDir(ctx context.Context, c *call, out *stream) error {
	var req watchRequest
	cl, err := s.decodeFor(c, &req)
	if err != nil {
		return err
	}
	dir, err := watchable(ctx, cl, resolvePath(req.Path, userOf(c.header)))
	if err != nil {
		return err
	}
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	started := func() error {
		if err := out.send(watchDirResponse{Start: &empty{}}); err != nil {
			return err
		}
		stop = out.keepalive(keepaliveInterval(c.header), watchDirResponse{Keepalive: &empty{}})
		return nil
	}
	return watchEvents(ctx, cl, dir, req, started, func(ev fsEvent) error {
		return out.send(watchDirResponse{Filesystem: &ev})
	})
}

// watchable checks that p can be watched, as envd does before it starts
// a watch: not_found when missing, invalid_argument when not a directory.
func watchable(ctx context.Context, cl *agent.Client, p string) (string, error) {
	fi, err := cl.Stat(ctx, p)
	if err != nil {
		return "", err
	}
	if fi.Type != wire.FileTypeDir && fi.Type != wire.FileTypeSymlink {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "path %s is not a directory", p)
	}
	return p, nil
}

// watchEvents watches dir through the agent until ctx ends or the watch
// fails. started is called once the agent has set the watch up, before
// any event is emitted, so a client told "started" misses no change made
// after it. emit gets E2B's events: names relative to dir; a rename within
// the tree becomes a rename of the old name and a create of the new one,
// as inotify-based watchers report it; overflow has no E2B equivalent and
// is dropped.
//
// The agent answers a watch request only once the watch is in place, so
// the first byte of its answer is the moment to call started.
func watchEvents(ctx context.Context, cl *agent.Client, dir string, req watchRequest, started func() error, emit func(fsEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answered, ready := make(chan struct{}), make(chan struct{})
	var once sync.Once
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotFirstResponseByte: func() { once.Do(func() { close(answered) }) },
	})
	done := make(chan error, 1)
	go func() {
		done <- cl.Watch(tctx, dir, req.Recursive, func(ev wire.WatchEvent) error {
			select {
			case <-ready:
			case <-ctx.Done():
				return ctx.Err()
			}
			for _, e := range convertWatch(dir, ev) {
				if req.IncludeEntry && e.Type != eventRemove && e.Type != eventRename {
					if fi, err := cl.Stat(ctx, path.Join(dir, e.Name)); err == nil {
						en := entryOf(fi)
						e.Entry = &en
					}
				}
				if err := emit(e); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		return err
	case <-answered:
	}
	if err := started(); err != nil {
		cancel()
		<-done
		return err
	}
	close(ready)
	return <-done
}

func convertWatch(root string, ev wire.WatchEvent) []fsEvent {
	rel := func(p string) string {
		if r, ok := relPath(root, p); ok {
			return r
		}
		return p
	}
	switch ev.Type {
	case wire.WatchCreate:
		return []fsEvent{{Name: rel(ev.Path), Type: eventCreate}}
	case wire.WatchWrite:
		return []fsEvent{{Name: rel(ev.Path), Type: eventWrite}}
	case wire.WatchRemove:
		return []fsEvent{{Name: rel(ev.Path), Type: eventRemove}}
	case wire.WatchChmod:
		return []fsEvent{{Name: rel(ev.Path), Type: eventChmod}}
	case wire.WatchRename:
		if ev.OldPath != "" {
			return []fsEvent{{Name: rel(ev.OldPath), Type: eventRename}, {Name: rel(ev.Path), Type: eventCreate}}
		}
		return []fsEvent{{Name: rel(ev.Path), Type: eventRename}}
	}
	return nil
}

// relPath returns p relative to root when p is below it.
func relPath(root, p string) (string, bool) {
	root = path.Clean(root)
	if root == "/" {
		return p[1:], len(p) > 1
	}
	if len(p) > len(root) && p[:len(root)] == root && p[len(root)] == '/' {
		return p[len(root)+1:], true
	}
	return "", false
}
