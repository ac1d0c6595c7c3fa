package agentd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/seccomp"
)

// Main runs the agent with command-line args (without "agent") and returns
// the process exit code: 0 after a graceful shutdown on SIGTERM or SIGINT
// (every started process killed first), 1 when start-up or serving fails,
// 2 for bad flags. It follows the start-up contract in the package
// documentation and logs to stderr, which may be a plain file.
func Main(args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	fl := flag.NewFlagSet("corral agent", flag.ContinueOnError)
	fl.SetOutput(os.Stderr)
	listenFD := fl.Int("listen-fd", -1, "inherited `fd` of a listening stream socket to serve on")
	readyFD := fl.Int("ready-fd", -1, "inherited `fd` to write \"ok\" (or \"error: ...\") to once ready")
	dial := fl.String("dial", "", "unix socket `path` to dial and serve over, instead of --listen-fd (gVisor, VMs)")
	filter := fl.String("seccomp", "", "seccomp `program` (base64) to install on the agent, or with --spawn-thread on the thread that starts processes, and so on everything it starts, before it serves")
	filterFile := fl.String("seccomp-file", "", "`file` holding the program of --seccomp, for an argv that must not change (gVisor restores a checkpoint only into the same one)")
	oneThread := fl.Bool("spawn-thread", false, "start every process from one thread that alone carries the --seccomp filter, instead of filtering every thread (gVisor, where a filter costs per thread)")
	limits := fl.String("limits", "", "`file` of FILE=VALUE lines, each a file to write before serving, such as a cgroup limit inside gVisor")
	var rlimits []rlimit
	fl.Func("rlimit", "`RLIMIT_NAME=VALUE`: lower that resource limit, soft and hard, before serving, for every process the agent starts (repeatable)", func(s string) error {
		r, err := parseRlimit(s)
		rlimits = append(rlimits, r)
		return err
	})
	if err := fl.Parse(args); err != nil {
		return 2
	}

	// Processes the agent starts get only their stdio: no inherited
	// descriptor (the ready pipe, the listener, whatever the driver's
	// environment leaked) may reach them. Needs Linux 5.11.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		log.Warn("marking inherited fds close-on-exec", "error", err)
	}
	var ready *os.File
	if *readyFD >= 0 {
		ready = os.NewFile(uintptr(*readyFD), "ready")
	}
	report := func(line string) {
		if ready == nil {
			return
		}
		if _, err := io.WriteString(ready, line); err != nil {
			log.Warn("writing to ready fd", "error", err)
		}
		ready.Close()
		ready = nil
	}
	failed := func(err error) int {
		log.Error("agent start-up failed", "error", err)
		report("error: " + err.Error() + "\n")
		return 1
	}
	for _, r := range rlimits {
		if err := r.set(); err != nil {
			return failed(err)
		}
	}
	// The filter and limits go in while the server is built below; the
	// agent serves and starts processes only after confined.
	spawn, confined, err := confine(*filter, *filterFile, *limits, *oneThread, log)
	if err != nil {
		return failed(err)
	}

	var ln net.Listener
	if *dial == "" {
		if ln, err = listener(*listenFD); err != nil {
			return failed(err)
		}
	}

	asInit := os.Getpid() == 1
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
		return failed(err)
	}
	if *dial != "" {
		return serveDialMode(*dial, srv, log, report, asInit)
	}
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

	// Ready first, then the log line: the agent's first log line took
	// 0.2-1.1 ms in a new sandbox (its formatting code's first run and
	// the log file's first write), which the create waited for.
	report("ok\n")
	log.Info("agent ready", "pid", os.Getpid(), "init", asInit)

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
func serveDialMode(path string, srv *Server, log *slog.Logger, report func(string), asInit bool) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	redial := make(chan os.Signal, 1)
	signal.Notify(redial, syscall.SIGHUP)
	defer signal.Stop(redial)
	var once sync.Once
	err := ServeDialing(ctx, path, srv.Handler(), log, func() {
		once.Do(func() {
			report("ok\n")
			// Beside the serving, not before it: in gVisor the agent's
			// first log line (its first time formatting, which loads
			// the time zone) held up serving for 0.7-1.4 ms in a
			// timeline of creates.
			go log.Info("agent ready", "pid", os.Getpid(), "init", asInit, "dial", path)
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

// confine makes the agent not dumpable, installs the seccomp program the
// driver passed, in filter or in the file filterFile (--seccomp,
// --seccomp-file), then writes the limits in the file limits (--limits);
// empty ones are left out. None of the sandbox's processes ever runs
// without the filter or the limits.
//
// confine returns at once, and the work goes on beside the caller's:
// confined returns its result, and the caller must have it before it
// serves or starts anything. By default the filter goes on every thread of
// the agent (TSYNC), threads made later inherit it, and the filter is
// installed and limits written while the caller builds its server (0.4-0.6
// ms each in a new runc sandbox). With oneThread (--spawn-thread) confine
// starts a spawner instead, whose first thread installs the filter on
// itself alone, writes the limits, and then starts processes (with threads
// it adds as needed, each filtered first). gVisor sandboxes use it (see
// spawner for why); under runc it would only add a thread switch to every
// exec (about 0.1 ms).
func confine(filter, filterFile, limits string, oneThread bool, log *slog.Logger) (spawn *spawner, confined func() error, err error) {
	// Not dumpable: the sandbox's processes, which run as the agent's user
	// (or, without user namespaces, as a root that may override file
	// modes), cannot open the agent's descriptors through /proc/1/fd, such
	// as its log on the host (in the run dir, a tmpfs), nor read its
	// memory or environment. What the agent starts is dumpable again after
	// its execve.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, nil, fmt.Errorf("making the agent not dumpable: %w", err)
	}
	var prog []unix.SockFilter
	setup := func(install func([]unix.SockFilter) error) error {
		if filterFile != "" {
			b, err := os.ReadFile(filterFile)
			if err != nil {
				return err
			}
			filter = string(b)
		}
		if filter != "" {
			var err error
			if prog, err = seccomp.Decode(filter); err != nil {
				return err
			}
			if err := install(prog); err != nil {
				return err
			}
		}
		if limits != "" {
			return writeLimits(limits)
		}
		return nil
	}
	if oneThread {
		// Threads added later install the program the first decoded,
		// which setup has done before any start can add one.
		more := func() error {
			if prog == nil {
				return nil
			}
			return seccomp.InstallThread(prog)
		}
		failed := func(err error) { log.Warn("adding a thread to start processes", "error", err) }
		spawn = startSpawner(func() error { return setup(seccomp.InstallThread) }, more, failed)
		return spawn, spawn.wait, nil
	}
	// Unwaited only when start-up fails before confined: the agent
	// exits then, and the goroutine with it.
	done := make(chan error, 1)
	go func() { done <- setup(seccomp.Install) }()
	return nil, func() error { return <-done }, nil
}

// writeLimits writes each FILE=VALUE line of the file path (--limits).
func writeLimits(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading limits: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		file, value, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(file, "/") {
			return fmt.Errorf("limits: want absolute FILE=VALUE lines, got %q", line)
		}
		if err := os.WriteFile(file, []byte(value), 0); err != nil {
			return fmt.Errorf("writing limit: %w", err)
		}
	}
	return nil
}

// rlimit is one resource limit of --rlimit, soft and hard alike.
type rlimit struct {
	name     string
	resource int
	value    uint64
}

// rlimitNames are the limits --rlimit knows, by their OCI names.
var rlimitNames = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING, "RLIMIT_STACK": unix.RLIMIT_STACK,
}

// parseRlimit parses RLIMIT_NAME=VALUE.
func parseRlimit(s string) (rlimit, error) {
	name, v, ok := strings.Cut(s, "=")
	res, known := rlimitNames[name]
	if !ok || !known {
		return rlimit{}, fmt.Errorf("want RLIMIT_NAME=VALUE with a known name, got %q", s)
	}
	value, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return rlimit{}, fmt.Errorf("limit %s: %w", name, err)
	}
	return rlimit{name, res, value}, nil
}

// set sets the limit on the agent, which every process it starts
// inherits. Lowering a limit needs no privilege, and nothing in the
// sandbox can raise it again: that takes CAP_SYS_RESOURCE in the host's
// user namespace. syscall.Setrlimit, not unix's: for RLIMIT_NOFILE it
// also stops the Go runtime from restoring the limit it found at start in
// the processes it forks.
func (r rlimit) set() error {
	lim := syscall.Rlimit{Cur: r.value, Max: r.value}
	if err := syscall.Setrlimit(r.resource, &lim); err != nil {
		return fmt.Errorf("setting %s to %d: %w", r.name, r.value, err)
	}
	return nil
}
