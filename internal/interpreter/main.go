package interpreter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Port is where the service listens in a sandbox: the port
// @e2b/code-interpreter talks to.
const Port = 49999

// Main runs the service with command-line args (without "interpreter")
// until SIGTERM or SIGINT, and returns the exit code: 0 after a graceful
// stop (every kernel killed), 1 when it cannot start, 2 for bad flags.
func Main(args []string) int {
	fs := flag.NewFlagSet("interpreter", flag.ContinueOnError)
	listen := fs.String("listen", ":"+strconv.Itoa(Port), "address to serve the HTTP API on")
	userName := fs.String("user", "", "run kernels as this account (when started as root); empty keeps the service's own")
	cwd := fs.String("cwd", "", "working directory of contexts that name none (default: the user's home, else /)")
	defaults := fs.String("defaults", "python,javascript", "languages whose default contexts start at once, comma-separated")
	maxOutput := fs.Int64("max-output", DefaultMaxOutput, "stdout and stderr bytes one execution may send")
	benchBare := fs.Int("bench-bare", 0, "instead of serving: time this many `1+1` round trips straight to a new Python kernel and print their median in microseconds (the peer of the service's own latency)")
	var tools Tools
	fs.StringVar(&tools.Python, "python", "python3", "Python interpreter with ipykernel")
	fs.StringVar(&tools.Node, "node", "node", "Node.js")
	fs.StringVar(&tools.Bash, "bash", "bash", "bash")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts, cleanup, err := options(*userName, *cwd, *defaults, tools)
	if err != nil {
		log.Error("code interpreter start-up failed", "error", err)
		return 1
	}
	defer cleanup()
	opts.MaxOutput, opts.Log = *maxOutput, log
	if *benchBare > 0 {
		return benchBareKernel(opts, *benchBare)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("code interpreter start-up failed", "error", err)
		return 1
	}
	s := NewServer(opts)
	defer s.Close()
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("code interpreter listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		log.Error("serving", "error", err)
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("shutting down", "error", err)
	}
	return 0
}

// options resolves the flags into Options: the kernels' account, their
// directory and environment, and a private runtime directory that cleanup
// removes.
func options(userName, cwd, defaults string, tools Tools) (Options, func(), error) {
	opts := Options{Tools: tools, Env: os.Environ()}
	for _, l := range strings.Split(defaults, ",") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		lang, err := Language(l)
		if err != nil {
			return Options{}, nil, err
		}
		opts.Defaults = append(opts.Defaults, lang)
	}
	home := "/"
	var uid, gid = os.Getuid(), os.Getgid()
	if userName != "" {
		u, err := user.Lookup(userName)
		if err != nil {
			return Options{}, nil, fmt.Errorf("looking up user %q: %w", userName, err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		home = u.HomeDir
		if os.Getuid() == 0 && uid != 0 {
			opts.Cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
		}
		opts.Env = setEnv(opts.Env, "HOME", u.HomeDir)
		opts.Env = setEnv(opts.Env, "USER", u.Username)
		opts.Env = setEnv(opts.Env, "LOGNAME", u.Username)
	} else if h, err := os.UserHomeDir(); err == nil {
		home = h
	}
	if cwd == "" {
		cwd = home
		if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
			cwd = "/"
		}
	}
	opts.Cwd = cwd
	dir, err := os.MkdirTemp("", "corral-interpreter-")
	if err != nil {
		return Options{}, nil, err
	}
	if opts.Cred != nil {
		// The kernels write their connection files and cells here.
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return Options{}, nil, err
		}
	}
	opts.Dir = dir
	return opts, func() { os.RemoveAll(dir) }, nil
}

// setEnv sets key in env, replacing an earlier value.
func setEnv(env []string, key, value string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}

// benchBareKernel prints the median of n `1+1` executions on a Python
// kernel of its own, through the same Jupyter client the contexts use but
// without HTTP or a context.
func benchBareKernel(opts Options, n int) int {
	ctx := context.Background()
	k, err := startKernel(ctx, kernelConfig{language: LangPython, cwd: opts.Cwd, env: opts.Env, dir: opts.Dir, cred: opts.Cred, tools: opts.Tools})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the kernel:", err)
		return 1
	}
	defer k.kill()
	times := make([]time.Duration, 0, n)
	for range n {
		begin := time.Now()
		var text any
		if _, err := k.run(ctx, "1+1", nil, func(e Event) { text = e.Result["text"] }); err != nil || text != "2" {
			fmt.Fprintln(os.Stderr, "1+1:", text, err)
			return 1
		}
		times = append(times, time.Since(begin))
	}
	slices.Sort(times)
	fmt.Println(times[len(times)/2].Microseconds())
	return 0
}
