package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"

	"connectrpc.com/connect"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/e2b/envdpb"
	"github.com/corralrun/corral/internal/errdefs"
)

// Polling watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher) are
// what E2B's synchronous Python SDK uses instead of the WatchDir stream.
// Each is an agent watch run by a goroutine the watcherSet owns, whose
// events wait in memory until polled.

const (
	// maxWatchers bounds the polling watchers of the whole server.
	maxWatchers = 1024
	// maxWatcherEvents bounds the events a watcher keeps between polls;
	// beyond it the oldest are dropped (E2B's API has no way to say so).
	maxWatcherEvents = 1 << 14
)

// watcherSet holds the polling watchers. It is safe for concurrent use.
type watcherSet struct {
	s  *Server
	wg sync.WaitGroup

	mu     sync.Mutex
	ws     map[string]*pollWatcher
	closed bool
}

// pollWatcher is one polling watcher.
type pollWatcher struct {
	sandbox string
	cancel  context.CancelFunc
	done    chan struct{} // closed when its goroutine has returned

	mu     sync.Mutex
	events []*envdpb.FilesystemEvent
	ended  bool
	err    error // why the watch ended, if it failed
}

func newWatcherSet(s *Server) *watcherSet {
	return &watcherSet{s: s, ws: make(map[string]*pollWatcher)}
}

// CreateWatcher starts a watcher and returns its ID once the watch is in
// place.
func (f filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[envdpb.CreateWatcherRequest]) (*connect.Response[envdpb.CreateWatcherResponse], error) {
	cl, user, err := f.s.agentUser(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	dir, err := watchable(ctx, cl, resolvePath(req.Msg.GetPath(), user))
	if err != nil {
		return nil, err
	}
	id, err := f.s.watchers.create(ctx, cl, watch{dir: dir, recursive: req.Msg.GetRecursive(), includeEntry: req.Msg.GetIncludeEntry()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.CreateWatcherResponse{WatcherId: id}), nil
}

// create starts a watcher of w for the call's sandbox and returns its ID
// once the watch is in place.
func (ws *watcherSet) create(ctx context.Context, cl *agentclient.Client, wt watch) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	// The watch outlives this request: it ends with RemoveWatcher, with
	// the sandbox, or when the server closes.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &pollWatcher{sandbox: callOf(ctx).sandbox, cancel: cancel, done: make(chan struct{})}

	ws.mu.Lock()
	if ws.closed {
		ws.mu.Unlock()
		cancel()
		return "", unavailable("the E2B API is shutting down")
	}
	ws.pruneLocked()
	if len(ws.ws) >= maxWatchers {
		ws.mu.Unlock()
		cancel()
		return "", errdefs.Errorf(errdefs.ErrResourceExhausted, "too many watchers (%d): remove some with RemoveWatcher", maxWatchers)
	}
	ws.ws[id] = w
	ws.wg.Add(1)
	ws.mu.Unlock()

	ready := make(chan struct{})
	go func() {
		defer ws.wg.Done()
		defer close(w.done)
		err := wt.run(wctx, cl, func() error { close(ready); return nil }, w.add)
		w.finish(wctx, err)
	}()
	select {
	case <-ready:
		return id, nil
	case <-w.done:
		ws.drop(id)
		if w.err == nil {
			return "", errdefs.Errorf(errdefs.ErrNotFound, "watching %s: the directory went away", wt.dir)
		}
		return "", w.err
	case <-ctx.Done():
		ws.drop(id)
		return "", ctx.Err()
	}
}

// GetWatcherEvents returns and forgets the events a watcher collected. A
// watcher whose watch failed returns its error once its events are
// drained, and is removed.
func (f filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[envdpb.GetWatcherEventsRequest]) (*connect.Response[envdpb.GetWatcherEventsResponse], error) {
	evs, err := f.s.watchers.events(req.Msg.GetWatcherId(), callOf(ctx).sandbox)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.GetWatcherEventsResponse{Events: evs}), nil
}

// events returns and forgets the events of watcher id of sandbox sb.
func (ws *watcherSet) events(id, sb string) ([]*envdpb.FilesystemEvent, error) {
	w, err := ws.get(id, sb)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, ended, werr := w.events, w.ended, w.err
	w.events = nil
	w.mu.Unlock()
	if len(evs) == 0 && ended {
		ws.drop(id)
		if werr != nil {
			return nil, werr
		}
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "watcher %s ended: its directory is gone", id)
	}
	return evs, nil
}

// RemoveWatcher stops a watcher and forgets it.
func (f filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[envdpb.RemoveWatcherRequest]) (*connect.Response[envdpb.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	if _, err := f.s.watchers.get(id, callOf(ctx).sandbox); err != nil {
		return nil, err
	}
	f.s.watchers.drop(id)
	return connect.NewResponse(&envdpb.RemoveWatcherResponse{}), nil
}

// get returns the watcher id of sandbox sb.
func (ws *watcherSet) get(id, sb string) (*pollWatcher, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.ws[id]
	if !ok || w.sandbox != sb {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "watcher %s not found", id)
	}
	return w, nil
}

// drop stops a watcher, waits for its goroutine and forgets it.
func (ws *watcherSet) drop(id string) {
	ws.mu.Lock()
	w, ok := ws.ws[id]
	delete(ws.ws, id)
	ws.mu.Unlock()
	if ok {
		w.cancel()
		<-w.done
	}
}

// pruneLocked forgets ended watchers of sandboxes that are gone, which
// nobody will poll again. ws.mu must be held.
func (ws *watcherSet) pruneLocked() {
	for id, w := range ws.ws {
		w.mu.Lock()
		ended := w.ended
		w.mu.Unlock()
		if _, err := ws.s.m.Get(context.Background(), w.sandbox); ended && err != nil {
			delete(ws.ws, id)
		}
	}
}

// close stops every watcher and waits for their goroutines.
func (ws *watcherSet) close() {
	ws.mu.Lock()
	ws.closed = true
	for id, w := range ws.ws {
		w.cancel()
		delete(ws.ws, id)
	}
	ws.mu.Unlock()
	ws.wg.Wait()
}

func (w *pollWatcher) add(ev *envdpb.FilesystemEvent) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) >= maxWatcherEvents {
		w.events = w.events[1:]
	}
	w.events = append(w.events, ev)
	return nil
}

// finish records how the watch ended; being stopped is no failure.
func (w *pollWatcher) finish(ctx context.Context, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	if ctx.Err() == nil {
		w.err = err
	}
}
