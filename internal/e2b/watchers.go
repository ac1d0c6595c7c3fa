package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"

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
	events []fsEvent
	ended  bool
	err    error // why the watch ended, if it failed
}

func newWatcherSet(s *Server) *watcherSet {
	return &watcherSet{s: s, ws: make(map[string]*pollWatcher)}
}

// create starts a watcher and returns its ID once the watch is in place.
func (ws *watcherSet) create(ctx context.Context, c *call) (response, error) {
	var req watchRequest
	cl, err := ws.s.decodeFor(c, &req)
	if err != nil {
		return nil, err
	}
	dir, err := watchable(ctx, cl, resolvePath(req.Path, userOf(c.header)))
	if err != nil {
		return nil, err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	// The watch outlives this request: it ends with RemoveWatcher, with
	// the sandbox, or when the server closes.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &pollWatcher{sandbox: c.sandbox, cancel: cancel, done: make(chan struct{})}

	ws.mu.Lock()
	if ws.closed {
		ws.mu.Unlock()
		cancel()
		return nil, unavailable("the E2B API is shutting down")
	}
	ws.pruneLocked()
	if len(ws.ws) >= maxWatchers {
		ws.mu.Unlock()
		cancel()
		return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "too many watchers (%d): remove some with RemoveWatcher", maxWatchers)
	}
	ws.ws[id] = w
	ws.wg.Add(1)
	ws.mu.Unlock()

	ready := make(chan struct{})
	go func() {
		defer ws.wg.Done()
		defer close(w.done)
		err := watchEvents(wctx, cl, dir, req, func() error { close(ready); return nil }, w.add)
		w.finish(wctx, err)
	}()
	select {
	case <-ready:
		return createWatcherResponse{WatcherID: id}, nil
	case <-w.done:
		ws.drop(id)
		if w.err == nil {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "watching %s: the directory went away", dir)
		}
		return nil, w.err
	case <-ctx.Done():
		ws.drop(id)
		return nil, ctx.Err()
	}
}

// events returns and forgets the events a watcher collected. A watcher
// whose watch failed returns its error once its events are drained, and
// is removed.
func (ws *watcherSet) events(_ context.Context, c *call) (response, error) {
	var req watcherRequest
	if err := c.decode(&req); err != nil {
		return nil, err
	}
	w, err := ws.get(req.WatcherID, c.sandbox)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, ended, werr := w.events, w.ended, w.err
	w.events = nil
	w.mu.Unlock()
	if len(evs) == 0 && ended {
		ws.drop(req.WatcherID)
		if werr != nil {
			return nil, werr
		}
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "watcher %s ended: its directory is gone", req.WatcherID)
	}
	if evs == nil {
		evs = []fsEvent{}
	}
	return watcherEventsResponse{Events: evs}, nil
}

func (ws *watcherSet) remove(_ context.Context, c *call) (response, error) {
	var req watcherRequest
	if err := c.decode(&req); err != nil {
		return nil, err
	}
	if _, err := ws.get(req.WatcherID, c.sandbox); err != nil {
		return nil, err
	}
	ws.drop(req.WatcherID)
	return empty{}, nil
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
		if _, err := ws.s.m.Get(w.sandbox); ended && err != nil {
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

func (w *pollWatcher) add(ev fsEvent) error {
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
