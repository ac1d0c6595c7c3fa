package agentserver

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// Options configure an agent server.
type Options struct {
	// Root prefixes every file path; "" or "/" inside a sandbox. The fake
	// driver sets it to a temporary directory so unit tests can run the
	// agent in-process on the host. Under a Root other than "/", file
	// operations go through os.Root, so neither ".." nor symbolic links can
	// reach outside it, and the user database is read from Root/etc.
	// Processes still run in the agent's own view of the file system: Root
	// does not chroot them, and exec's cwd and executable are host paths.
	Root string
	// Version is reported by /health.
	Version string
	// Logger receives start-up and failure logs; nil discards them.
	Logger *slog.Logger
	// Init makes the server reap every child of the process (wait4(-1)),
	// as it must when it is PID 1 of a sandbox. Without it the server waits
	// only for the processes it started. Only one Init server may run in a
	// process, and nothing else in that process may wait for children.
	Init bool
	// ForkExec starts every process the server runs; nil means
	// syscall.ForkExec. The agent passes its spawner's, whose thread
	// carries the sandbox's seccomp filter.
	ForkExec ForkExecFunc
}

// Server serves the agent protocol. Close kills every process it started.
//
// A Server is safe for concurrent use; every request runs on the HTTP
// server's goroutine, and the goroutines the Server starts itself (one per
// running process plus its output pumps and stdin feeder, and the reaper
// under Init) are stopped and waited for by Close. Streams that do not end
// with a process (watches) are ended by Close too; request handlers start
// only helpers they wait for before returning.
type Server struct {
	opts  Options
	log   *slog.Logger
	fs    fileSystem // nil when fsErr is set
	fsErr error
	procs *procTable
	mux   *routes

	// svc is the service POST /service started, if any.
	svcMu sync.Mutex
	svc   *service

	closeOnce sync.Once
	closed    atomic.Bool

	// streams holds the cancel functions of open streams that do not end
	// by themselves when the processes are gone (watches), for Close.
	streamsMu   sync.Mutex
	streams     map[uint64]context.CancelFunc
	nextStream  uint64
	streamsDone bool
}

// NewServer returns an agent server. It opens Root (when set) and, under
// Init, starts the reaper; if Root cannot be opened the server still serves
// exec and health, and every file operation fails with ErrUnavailable.
func NewServer(opts Options) *Server {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: log, streams: make(map[uint64]context.CancelFunc)}
	if root := filepath.Clean(opts.Root); opts.Root == "" || root == "/" {
		s.fs = hostFS{}
	} else if r, err := os.OpenRoot(root); err != nil {
		s.fsErr = errdefs.Errorf(errdefs.ErrUnavailable, "opening file system root %s: %v", root, err)
		log.Error("opening file system root", "root", root, "error", err)
	} else {
		s.fs = rootFS{r: r}
	}
	var r *reaper
	if opts.Init {
		r = startReaper()
	}
	s.procs = newProcTable(log, r, opts.ForkExec)

	mux := newRoutes()
	mux.handle("GET", "/health", s.handleHealth)
	mux.handle("POST", "/exec", s.handleExec)
	mux.handle("GET", "/files", s.handleReadFile)
	mux.handle("PUT", "/files", s.handleWriteFile)
	mux.handle("DELETE", "/files", s.handleRemove)
	mux.handle("GET", "/files/stat", s.handleStat)
	mux.handle("GET", "/files/list", s.handleList)
	mux.handle("POST", "/files/mkdir", s.handleMkdir)
	mux.handle("POST", "/files/rename", s.handleRename)
	mux.handle("GET", "/files/archive", s.handleReadArchive)
	mux.handle("PUT", "/files/archive", s.handleWriteArchive)
	mux.handle("GET", "/files/watch", s.handleWatch)
	mux.handle("POST", "/processes", s.handleStart)
	mux.handle("GET", "/processes", s.handleProcesses)
	mux.handle("GET", "/processes/{pid}", s.handleProcess)
	mux.handle("DELETE", "/processes/{pid}", s.handleRemoveProcess)
	mux.handle("GET", "/processes/{pid}/output", s.handleOutput)
	mux.handle("POST", "/processes/{pid}/stdin", s.handleStdin)
	mux.handle("DELETE", "/processes/{pid}/stdin", s.handleCloseStdin)
	mux.handle("POST", "/processes/{pid}/signal", s.handleSignal)
	mux.handle("POST", "/processes/{pid}/resize", s.handleResize)
	mux.handle("GET", "/processes/{pid}/wait", s.handleWait)
	mux.handle("GET", "/connect", s.handleConnect)
	mux.handle("POST", "/service", s.handleStartService)
	mux.handle("GET", "/service", s.handleService)
	s.mux = mux
	return s
}

// Handler returns the HTTP handler of the agent protocol (see the package
// documentation). It is safe to serve it from many connections at once.
func (s *Server) Handler() http.Handler { return s.mux }

// Close kills all processes started by the server (SIGKILL to each process
// group), waits until each is reaped and its output goroutines have ended,
// ends watch streams, stops the reaper and releases Root. Requests that
// arrive afterwards fail with ErrUnavailable; exec and output streams
// still open receive their exit events. Close is idempotent and blocks for
// as long as a killed process takes to die.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.streamsMu.Lock()
		s.streamsDone = true
		for _, cancel := range s.streams {
			cancel()
		}
		s.streamsMu.Unlock()
		s.stopService()
		s.procs.close()
		if rf, ok := s.fs.(rootFS); ok {
			if err := rf.r.Close(); err != nil {
				s.log.Warn("closing file system root", "error", err)
			}
		}
	})
	return nil
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, wire.Health{OK: true, Version: s.opts.Version, PID: os.Getpid()})
}

// files returns the file system of the server, or why there is none.
func (s *Server) files() (fileSystem, error) {
	if s.closed.Load() {
		return nil, errShuttingDown
	}
	if s.fsErr != nil {
		return nil, s.fsErr
	}
	return s.fs, nil
}

// trackStream returns a context for a stream that Close must end, and a
// function to call when the stream is over.
func (s *Server) trackStream(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.streamsDone {
		cancel()
		return ctx, func() {}
	}
	id := s.nextStream
	s.nextStream++
	s.streams[id] = cancel
	return ctx, func() {
		s.streamsMu.Lock()
		delete(s.streams, id)
		s.streamsMu.Unlock()
		cancel()
	}
}

// afterFunc runs f in its own goroutine once ctx is done, like
// context.AfterFunc, but the returned stop also waits for a run of f that
// has begun, so nothing is left running when the caller returns.
func afterFunc(ctx context.Context, f func()) (stop func()) {
	ran := make(chan struct{})
	stopFn := context.AfterFunc(ctx, func() {
		defer close(ran)
		f()
	})
	return func() {
		if !stopFn() {
			<-ran
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The status line is out; an encoding or write failure can only mean
	// the client went away, which the HTTP server notices on its own.
	_ = jsonEncoder(w).Encode(v)
}

// errShuttingDown answers requests that arrive during or after Close.
var errShuttingDown = errdefs.Errorf(errdefs.ErrUnavailable, "agent is shutting down")

// errorf is errdefs.Errorf, kept short because the handlers use it a lot.
func errorf(kind error, format string, args ...any) error {
	return errdefs.Errorf(kind, format, args...)
}
