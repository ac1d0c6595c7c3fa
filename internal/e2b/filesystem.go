package e2b

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptrace"
	"path"
	"strconv"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/e2b/envdpb"
	"github.com/corralrun/corral/internal/e2b/envdpb/envdpbconnect"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// This file serves E2B's filesystem.Filesystem service on the agent's file
// API. Paths may be relative to the user's home directory, as in envd.

// filesystemService implements filesystem.Filesystem for a Server.
type filesystemService struct{ s *Server }

var _ envdpbconnect.FilesystemHandler = filesystemService{}

// maxListEntries bounds one ListDir answer, which is built in memory.
const maxListEntries = 1 << 17

// entryOf converts the agent's file description to E2B's: mode is the
// permission bits, permissions their "ls -l" form, owner and group names
// ("root" for ID 0, the number otherwise: Corral does not read the
// sandbox's user database for listings).
func entryOf(fi wire.FileInfo) *envdpb.EntryInfo {
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
	t := envdpb.FileType_FILE_TYPE_UNSPECIFIED
	switch fi.Type {
	case wire.FileTypeFile:
		t = envdpb.FileType_FILE_TYPE_FILE
	case wire.FileTypeDir:
		t, mode = envdpb.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case wire.FileTypeSymlink:
		t, mode = envdpb.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
	default:
		mode |= fs.ModeIrregular
	}
	e := &envdpb.EntryInfo{Name: fi.Name, Type: t, Path: fi.Path, Size: fi.Size, Mode: fi.Mode & 0o777,
		Permissions: mode.String(), Owner: idName(fi.UID), Group: idName(fi.GID)}
	if !fi.ModTime.IsZero() {
		e.ModifiedTime = timestamppb.New(fi.ModTime)
	}
	if fi.Type == wire.FileTypeSymlink {
		e.SymlinkTarget = proto.String(fi.Target)
	}
	return e
}

func idName(id int) string {
	if id == 0 {
		return "root"
	}
	return strconv.Itoa(id)
}

// agentUser returns the agent of the call's sandbox and the user the call
// runs as.
func (s *Server) agentUser(ctx context.Context, h http.Header) (*agentclient.Client, string, error) {
	cl, err := s.agent(callOf(ctx).sandbox)
	return cl, userOf(h), err
}

// Stat describes a file.
func (f filesystemService) Stat(ctx context.Context, req *connect.Request[envdpb.StatRequest]) (*connect.Response[envdpb.StatResponse], error) {
	cl, user, err := f.s.agentUser(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	fi, err := cl.Stat(ctx, resolvePath(req.Msg.GetPath(), user))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.StatResponse{Entry: entryOf(fi)}), nil
}

// MakeDir creates a directory and its missing parents. As in envd, an
// existing directory is already_exists (the SDK's makeDir then returns
// false) and an existing file is invalid_argument.
func (f filesystemService) MakeDir(ctx context.Context, req *connect.Request[envdpb.MakeDirRequest]) (*connect.Response[envdpb.MakeDirResponse], error) {
	cl, user, err := f.s.agentUser(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	p := resolvePath(req.Msg.GetPath(), user)
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
	return connect.NewResponse(&envdpb.MakeDirResponse{Entry: entryOf(fi)}), nil
}

// Move renames a file or directory.
func (f filesystemService) Move(ctx context.Context, req *connect.Request[envdpb.MoveRequest]) (*connect.Response[envdpb.MoveResponse], error) {
	cl, user, err := f.s.agentUser(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	fi, err := cl.Rename(ctx, resolvePath(req.Msg.GetSource(), user), resolvePath(req.Msg.GetDestination(), user))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.MoveResponse{Entry: entryOf(fi)}), nil
}

// ListDir lists a directory to the given depth (1: its entries only).
func (f filesystemService) ListDir(ctx context.Context, req *connect.Request[envdpb.ListDirRequest]) (*connect.Response[envdpb.ListDirResponse], error) {
	cl, user, err := f.s.agentUser(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	out := &envdpb.ListDirResponse{}
	err = walkDir(ctx, cl.List, resolvePath(req.Msg.GetPath(), user), depth, func(fi wire.FileInfo) {
		out.Entries = append(out.Entries, entryOf(fi))
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// walkDir calls visit for the entries of dir that list returns, and for
// those of its subdirectories down to depth levels (1: dir's entries
// only), depth first; it stops at maxListEntries entries in all, since
// the answer is built in memory.
func walkDir(ctx context.Context, list func(context.Context, string) ([]wire.FileInfo, error), dir string, depth int, visit func(wire.FileInfo)) error {
	n := 0
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		infos, err := list(ctx, dir)
		if err != nil {
			return err
		}
		for _, fi := range infos {
			if n >= maxListEntries {
				return errdefs.Errorf(errdefs.ErrResourceExhausted, "listing has more than %d entries: list with a smaller depth", maxListEntries)
			}
			n++
			visit(fi)
			if depth > 1 && fi.Type == wire.FileTypeDir {
				if err := walk(fi.Path, depth-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(dir, depth)
}

// Remove removes a file or a directory tree. A path that does not exist
// is not an error, as with envd's os.RemoveAll.
func (f filesystemService) Remove(ctx context.Context, req *connect.Request[envdpb.RemoveRequest]) (*connect.Response[envdpb.RemoveResponse], error) {
	cl, user, err := f.s.agentUser(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	if err := cl.Remove(ctx, resolvePath(req.Msg.GetPath(), user), true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	return connect.NewResponse(&envdpb.RemoveResponse{}), nil
}

// WatchDir streams the changes in a directory: a start event once the
// watch is in place, then one event per change, with keepalives.
func (f filesystemService) WatchDir(ctx context.Context, req *connect.Request[envdpb.WatchDirRequest], stream *connect.ServerStream[envdpb.WatchDirResponse]) error {
	cl, user, err := f.s.agentUser(ctx, req.Header())
	if err != nil {
		return err
	}
	dir, err := watchable(ctx, cl, resolvePath(req.Msg.GetPath(), user))
	if err != nil {
		return err
	}
	out := &sender[*envdpb.WatchDirResponse]{send: stream.Send}
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	started := func() error {
		start := &envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Start{Start: &envdpb.WatchDirResponse_StartEvent{}}}
		if err := out.Send(start); err != nil {
			return err
		}
		keepalive := &envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Keepalive{Keepalive: &envdpb.WatchDirResponse_KeepAlive{}}}
		stop = out.keepalive(keepaliveInterval(req.Header()), keepalive)
		return nil
	}
	w := watch{dir: dir, recursive: req.Msg.GetRecursive(), includeEntry: req.Msg.GetIncludeEntry()}
	return w.run(ctx, cl, started, func(ev *envdpb.FilesystemEvent) error {
		return out.Send(&envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Filesystem{Filesystem: ev}})
	})
}

// watchable checks that p can be watched, as envd does before it starts
// a watch: not_found when missing, invalid_argument when not a directory.
func watchable(ctx context.Context, cl *agentclient.Client, p string) (string, error) {
	fi, err := cl.Stat(ctx, p)
	if err != nil {
		return "", err
	}
	if fi.Type != wire.FileTypeDir && fi.Type != wire.FileTypeSymlink {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "path %s is not a directory", p)
	}
	return p, nil
}

// watch is a watch of a directory, as WatchDir and CreateWatcher ask.
type watch struct {
	dir                     string
	recursive, includeEntry bool
}

// run watches w.dir through the agent until ctx ends or the watch
// fails. started is called once the agent has set the watch up, before
// any event is emitted, so a client told "started" misses no change made
// after it. emit gets E2B's events: names relative to dir; a rename within
// the tree becomes a rename of the old name and a create of the new one,
// as inotify-based watchers report it; overflow has no E2B equivalent and
// is dropped.
//
// The agent answers a watch request only once the watch is in place, so
// the first byte of its answer is the moment to call started.
func (w watch) run(ctx context.Context, cl *agentclient.Client, started func() error, emit func(*envdpb.FilesystemEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answered, ready := make(chan struct{}), make(chan struct{})
	var once sync.Once
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotFirstResponseByte: func() { once.Do(func() { close(answered) }) },
	})
	done := make(chan error, 1)
	go func() {
		done <- cl.Watch(tctx, w.dir, w.recursive, func(ev wire.WatchEvent) error {
			select {
			case <-ready:
			case <-ctx.Done():
				return ctx.Err()
			}
			for _, e := range convertWatch(w.dir, ev) {
				if w.includeEntry && e.Type != envdpb.EventType_EVENT_TYPE_REMOVE && e.Type != envdpb.EventType_EVENT_TYPE_RENAME {
					if fi, err := cl.Stat(ctx, path.Join(w.dir, e.Name)); err == nil {
						e.Entry = entryOf(fi)
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

func convertWatch(root string, ev wire.WatchEvent) []*envdpb.FilesystemEvent {
	rel := func(p string) string {
		if r, ok := relPath(root, p); ok {
			return r
		}
		return p
	}
	switch ev.Type {
	case wire.WatchCreate:
		return []*envdpb.FilesystemEvent{{Name: rel(ev.Path), Type: envdpb.EventType_EVENT_TYPE_CREATE}}
	case wire.WatchWrite:
		return []*envdpb.FilesystemEvent{{Name: rel(ev.Path), Type: envdpb.EventType_EVENT_TYPE_WRITE}}
	case wire.WatchRemove:
		return []*envdpb.FilesystemEvent{{Name: rel(ev.Path), Type: envdpb.EventType_EVENT_TYPE_REMOVE}}
	case wire.WatchChmod:
		return []*envdpb.FilesystemEvent{{Name: rel(ev.Path), Type: envdpb.EventType_EVENT_TYPE_CHMOD}}
	case wire.WatchRename:
		if ev.OldPath != "" {
			return []*envdpb.FilesystemEvent{{Name: rel(ev.OldPath), Type: envdpb.EventType_EVENT_TYPE_RENAME}, {Name: rel(ev.Path), Type: envdpb.EventType_EVENT_TYPE_CREATE}}
		}
		return []*envdpb.FilesystemEvent{{Name: rel(ev.Path), Type: envdpb.EventType_EVENT_TYPE_RENAME}}
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
