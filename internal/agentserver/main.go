package agentserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/vmguest"
)

// Main runs the agent with command-line args (without "agent") and returns
// the process exit code: 0 after a graceful shutdown on SIGTERM or SIGINT
// (every started process killed first), 1 when start-up or serving fails,
// 2 for bad flags. It follows the start-up contract in the package
// documentation and logs to stderr, which may be a plain file.
func Main(args []string) int {
	st := startTimes{began: time.Now()}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg, err := parseFlags(args)
	if err != nil {
		return 2
	}
	if cfg.vm {
		if err := vmguest.Boot(cfg.vmOpts); err != nil {
			log.Error("booting the VM", "error", err)
			return 1
		}
	}
	// Processes the agent starts get only their stdio: no inherited
	// descriptor (the ready pipe, the listener, whatever the driver's
	// environment leaked) may reach them. Needs Linux 5.11.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		log.Warn("marking inherited fds close-on-exec", "error", err)
	}
	ready := newReadyPipe(cfg.readyFD, log)
	asInit := os.Getpid() == 1
	srv, ln, err := startUp(cfg, asInit, log)
	st.setUp = time.Since(st.began)
	if err != nil {
		log.Error("agent start-up failed", "error", err)
		ready.report("error: " + err.Error() + "\n")
		return 1
	}
	if cfg.dial != "" {
		return serveDialMode(cfg.dial, srv, log, ready.report, asInit, st)
	}
	return serveListener(ln, srv, log, ready.report, asInit, st)
}

// startTimes are the moments of the agent's start-up that its "agent
// ready" log line reports, to tell the agent's own start from the
// runtime's and the driver's in a sandbox's start.
type startTimes struct {
	began time.Time     // Main was called
	setUp time.Duration // from began until startUp returned
}

// attrs are the log attributes of st at readiness: set_up_ms (rlimits,
// confinement, the server) and ready_ms (until the first request can
// arrive).
func (st startTimes) attrs() []any {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return []any{"set_up_ms", ms(st.setUp), "ready_ms", ms(time.Since(st.began))}
}

// readyPipe holds the write end of the ready pipe (--ready-fd; f is nil
// without one), from which the driver reads exactly one line.
type readyPipe struct {
	f   *os.File
	log *slog.Logger
}

func newReadyPipe(fd int, log *slog.Logger) *readyPipe {
	r := &readyPipe{log: log}
	if fd >= 0 {
		r.f = os.NewFile(uintptr(fd), "ready")
	}
	return r
}

// report writes line and closes the pipe; later calls do nothing, so that
// the driver sees one answer.
func (r *readyPipe) report(line string) {
	if r.f == nil {
		return
	}
	if _, err := io.WriteString(r.f, line); err != nil {
		r.log.Warn("writing to ready fd", "error", err)
	}
	r.f.Close()
	r.f = nil
}

// startUp lowers the rlimits, confines the agent, takes the inherited
// listener (none with --dial), brings up loopback as PID 1 and builds the
// server. The filter and limits go in while the server is built, and
// startUp returns only once they are in: the agent serves and starts
// processes only confined.
func startUp(cfg agentFlags, asInit bool, log *slog.Logger) (*Server, net.Listener, error) {
	for _, r := range cfg.rlimits {
		if err := r.set(); err != nil {
			return nil, nil, err
		}
	}
	spawn, confined, err := confine(confinementOf(cfg), log)
	if err != nil {
		return nil, nil, err
	}
	var ln net.Listener
	if cfg.dial == "" {
		if ln, err = listener(cfg.listenFD); err != nil {
			return nil, nil, err
		}
	}
	if asInit {
		if err := bringUpLoopback(); err != nil {
			log.Warn("bringing up loopback interface", "error", err)
		}
	}
	opts := Options{Version: version(), Logger: log, Init: asInit}
	if spawn != nil {
		opts.ForkExec = spawn.forkExec
	}
	srv := NewServer(opts)
	if err := confined(); err != nil {
		return nil, nil, err
	}
	return srv, ln, nil
}

// serveListener serves srv on ln until SIGTERM or SIGINT, or until serving
// fails, and returns the exit code. Serving begins before it reports
// ready, so the first request finds a server.
func serveListener(ln net.Listener, srv *Server, log *slog.Logger, report func(string), asInit bool, st startTimes) int {
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(stop)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	// Ready first, then the log line: a new sandbox's first log line runs
	// formatting code and writes the log file for the first time, and the
	// create waits for ready, not for the log.
	report("ok\n")
	log.Info("agent ready", append([]any{"pid", os.Getpid(), "init", asInit}, st.attrs()...)...)

	code := 0
	select {
	case sig := <-stop:
		log.Info("agent shutting down", "signal", sig.String())
		// Processes first, so that open exec streams still get their
		// exit events; then connections and the listener.
		closeServers(srv, hs)
		<-served // http.ErrServerClosed
	case err := <-served:
		log.Error("agent serving failed", "error", err)
		code = 1
		closeServers(srv, hs)
	}
	return code
}

// serveDialMode serves srv over connections the agent dials to path until
// SIGTERM or SIGINT. The first successful dial is the agent's readiness.
func serveDialMode(path string, srv *Server, log *slog.Logger, report func(string), asInit bool, st startTimes) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	redial := make(chan os.Signal, 1)
	signal.Notify(redial, syscall.SIGHUP)
	defer signal.Stop(redial)
	var once sync.Once
	err := ServeDialing(ctx, path, srv.Handler(), log, func() {
		once.Do(func() {
			report("ok\n")
			attrs := append([]any{"pid", os.Getpid(), "init", asInit, "dial", path}, st.attrs()...)
			// Beside the serving, not before it: in gVisor the agent's
			// first log line formats a time for the first time, which
			// loads the time zone, and serving must not wait for that.
			go log.Info("agent ready", attrs...)
		})
	}, redial)
	srv.Close()
	if ctx.Err() != nil {
		log.Info("agent shut down")
		return 0
	}
	log.Error("agent serving failed", "error", err)
	return 1
}

// closeServers closes srv, then hs. Open exec streams end with the exit
// events of their killed processes, so hs is shut down gracefully for a
// moment before connections are cut. A client that stopped reading an
// exec stream would keep srv.Close waiting for the stream's output to be
// taken, so after a grace period the connections are cut first.
func closeServers(srv *Server, hs *http.Server) {
	const grace = 5 * time.Second
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		srv.Close()
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-closed:
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		_ = hs.Shutdown(ctx) // on timeout, Close below cuts what is left
	case <-timer.C:
	}
	hs.Close()
	<-closed
}

// listener turns the inherited listening socket into a net.Listener. The
// inherited fd is closed: FileListener works on a close-on-exec copy.
func listener(fd int) (net.Listener, error) {
	if fd < 0 {
		return nil, errors.New("--listen-fd is required")
	}
	f := os.NewFile(uintptr(fd), "listener")
	if f == nil {
		return nil, fmt.Errorf("invalid --listen-fd %d", fd)
	}
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("using fd %d as listener: %w", fd, err)
	}
	return ln, nil
}

// bringUpLoopback sets IFF_UP on "lo": a fresh network namespace has its
// loopback interface down, and sandboxed programs expect localhost to work.
func bringUpLoopback() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening socket for ioctl on lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("preparing ioctl on lo: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading flags of lo: %w", err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(flags | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("setting lo up: %w", err)
	}
	return nil
}

// version is the module version the binary was built from, "(devel)" for a
// local build.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return ""
}
