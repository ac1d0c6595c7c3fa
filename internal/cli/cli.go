// Package cli implements the corral command line: the client commands built
// on the public SDK, plus dispatch to the daemon and the agent. It parses
// flags and prints; it makes no decisions a user of the API could not make.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// Version is the build's version, set with -ldflags "-X ...cli.Version=v".
var Version = "dev"

// Exit codes of the CLI itself, as docker uses them: 125 for the CLI or
// daemon failing, 126 for a command that cannot be run, 127 for a command
// not found. Commands run in a sandbox exit with their own status.
const (
	exitCLI         = 125
	exitCannotRun   = 126
	exitNotFound    = 127
	exitUsage       = 2
	exitInterrupted = 130
)

// Env is the process environment the CLI runs in, replaceable in tests.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// Main runs the CLI with args (without the program name) and returns the
// exit code. Daemon and agent entry points are passed in so this package
// does not import them.
func Main(args []string, env Env, server, agent func(args []string) int) int {
	if len(args) == 0 {
		usage(env.Stderr)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "server":
		return server(rest)
	case "agent":
		return agent(rest)
	case "version", "--version":
		fmt.Fprintln(env.Stdout, "corral", Version)
		return 0
	case "help", "-h", "--help":
		usage(env.Stdout)
		return 0
	}
	c := &cli{env: env}
	handlers := map[string]func([]string) int{
		"run":      c.run,
		"create":   c.create,
		"exec":     c.exec,
		"ls":       c.ls,
		"rm":       c.rm,
		"inspect":  c.inspect,
		"timeout":  c.timeout,
		"update":   c.update,
		"network":  c.network,
		"port":     c.port,
		"template": c.template,
		"shell":    c.shell,
		"attach":   c.attach,
		"ps":       c.ps,
		"logs":     c.logs,
		"kill":     c.kill,
		"cp":       c.cp,
		"bench":    c.bench,
		"doctor":   c.doctor,
		"events":   c.events,
		"pool":     c.pool,
		"pause":    c.pause,
		"resume":   c.resume,
		"snapshot": c.snapshot,
		"fork":     c.fork,
	}
	h, ok := handlers[cmd]
	if !ok {
		fmt.Fprintf(env.Stderr, "corral: unknown command %q\n", cmd)
		usage(env.Stderr)
		return exitUsage
	}
	return h(rest)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: corral COMMAND [flags]

Sandboxes:
  run [flags] -- CMD...        create a sandbox, run CMD, print its output, destroy it
  create [flags]               create a sandbox and print its ID
  exec [flags] ID -- CMD...    run CMD in a sandbox; exits with its status
                               (-d: start it in the background and print its PID)
  shell [flags] ID [-- CMD...] interactive terminal (default: the user's login shell);
                               exits with the remote status
  ls [--state S] [-q]          list sandboxes
  inspect ID                   show a sandbox as JSON
  timeout ID DURATION          set a sandbox's deadline to now+DURATION (0: none)
  update ID [--cpus N] [--memory M] [--pids N]   change a running sandbox's limits
  update ID [--idle-timeout D] [--on-idle A] [--on-deadline A]
                               change its idle timeout and timer actions (destroy|pause)
  network ID [--mode M] [--allow-domain D]... [--allow-cidr C]...
                               show a sandbox's network policy, or replace it live
  port ID PORT                 print the URL at which the daemon forwards HTTP and
                               WebSockets to PORT of a sandbox (API key required on TCP)
  rm ID...                     destroy sandboxes
  events [--sandbox ID] [--type T]... [--json]
                               follow lifecycle events (created, running, deleted, ...)

Snapshots (runtimes say what they hold: "corral doctor" or GET /v1/runtimes):
  pause ID...                  freeze every process of sandboxes
  resume [--timeout D] ID      thaw a sandbox; its deadline becomes now+D (default: the daemon's)
  snapshot create [--metadata K=V]... ID NAME
                               save a sandbox: files (runc), or files, memory and processes (gVisor)
  snapshot ls | rm NAME...     list or delete snapshots
  snapshot template SNAPSHOT TEMPLATE
                               make a template of a snapshot's files
  create --from-snapshot NAME  start a sandbox from a snapshot
  fork [--count N] ID          copy a sandbox N times (gVisor: the processes go on in each copy)

Processes:
  ps ID                        list processes (running, and exited ones kept)
  logs [-f] [--from N] ID PID  print a process's output (replay, then follow with -f)
  attach [-i] ID PID           connect to a process (PTY: Ctrl-] detaches; the process keeps running)
  kill [-s SIG] ID PID         signal a process (default SIGKILL)

Files:
  cp SRC DST                   copy between the host and a sandbox; one side is ID:/path.
                               Like docker cp: a file onto an existing directory goes
                               inside it; a directory onto an existing directory goes
                               inside it as DIR/<name> (SRC ending in /. copies only its
                               contents); a directory onto a missing path creates it.

Templates:
  template ls                  list templates
  template pull NAME REF [--platform P] [--insecure]
                               make a template from a registry image (its Env, WorkingDir
                               and User become the defaults of execs in its sandboxes)
  template import NAME FILE    from a root file system tarball, an OCI image layout tar
                               or a docker save archive
  template build NAME [--recipe debian|busybox]
  template build NAME -f Dockerfile [CONTEXT] [--build-arg K=V]...
                               build a Dockerfile (FROM, RUN, COPY, ADD, ENV, WORKDIR,
                               USER, ARG, ...); RUN steps run in sandboxes, without
                               network unless --network or --allow-domain say otherwise;
                               unchanged steps come from the cache
  template rm NAME...          delete templates

Warm pools (creates of a pool's shape, or with --pool NAME, take a ready sandbox):
  pool set NAME --template T [--runtime R] [--cpus N] [--memory M] [--pids N]
           [--disk D] [--network MODE] --size N      define or change a pool
  pool ls                      list pools with their ready sandboxes
  pool rm NAME...              delete pools and their unclaimed sandboxes

Daemon:
  server [flags]               run the daemon
  version
  doctor [--json]              which runtimes and storage work on this host, and fixes
  bench [--runtime R] [--iterations N] [--burst B] [--density D] [--peers] [--json]
                               measure latency, burst, density (and peers) against the daemon

Clients find the daemon through CORRAL_HOST (default unix:///run/corral/corral.sock,
or http://host:port) and CORRAL_API_KEY.
`)
}

type cli struct {
	env Env
}

func (c *cli) client() (*corral.Client, error) {
	host := c.env.Getenv("CORRAL_HOST")
	return corral.New(host, c.env.Getenv("CORRAL_API_KEY"))
}

// fail prints err and returns the CLI's exit code for it.
func (c *cli) fail(err error) int {
	fmt.Fprintf(c.env.Stderr, "corral: %v\n", err)
	switch corral.ErrorCode(err) {
	case corral.CodeNotFound:
		var e *corral.Error
		if errors.As(err, &e) && strings.Contains(e.Message, "executable") {
			return exitNotFound
		}
	case corral.CodePermissionDenied:
		return exitCannotRun
	}
	if errors.Is(err, context.Canceled) {
		return exitInterrupted
	}
	return exitCLI
}

func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("corral "+name, flag.ContinueOnError)
	fs.SetOutput(c.env.Stderr)
	return fs
}

// signalContext is canceled on SIGINT, SIGTERM or SIGHUP, so that an
// interrupted run still destroys its sandbox and a shell whose terminal
// went away still restores it and removes its remote process.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
}

// createFlags are the flags shared by create and run.
type createFlags struct {
	template, runtime string
	cpus              float64
	memory, disk      string
	pids              int64
	timeout           string
	env, metadata     multiFlag
	net               networkFlags
	pool              string
	timers            timerFlags
	fromSnapshot      string
}

func (f *createFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.template, "template", "", "template to start from (default: default, or the pool's with --pool)")
	fs.StringVar(&f.runtime, "runtime", "", "isolation runtime (default: the daemon's)")
	fs.Float64Var(&f.cpus, "cpus", 0, "CPU limit in cores, e.g. 0.5 (default: the daemon's)")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M or 2G (default: the daemon's)")
	fs.StringVar(&f.disk, "disk", "", "disk limit, e.g. 1G (btrfs storage only)")
	fs.Int64Var(&f.pids, "pids", 0, "maximum number of processes and threads")
	fs.StringVar(&f.timeout, "timeout", "", "lifetime, e.g. 10m; 0 for no deadline (default: the daemon's)")
	fs.Var(&f.env, "e", "environment variable KEY=VALUE (repeatable)")
	fs.Var(&f.metadata, "metadata", "metadata KEY=VALUE (repeatable)")
	f.net.register(fs, "network")
	fs.StringVar(&f.pool, "pool", "", "warm pool to take the sandbox from (default: a pool of the same shape, if any)")
	fs.StringVar(&f.fromSnapshot, "from-snapshot", "", "start from a snapshot (its template, runtime, limits and environment are the defaults)")
	f.timers.register(fs)
}

func (f *createFlags) options() (corral.CreateOptions, error) {
	opts := corral.CreateOptions{Template: f.template, Runtime: f.runtime, CPUs: f.cpus, Pids: f.pids, Network: f.net.policy(),
		Pool: f.pool, FromSnapshot: f.fromSnapshot}
	if opts.Template == "" && opts.Pool == "" && opts.FromSnapshot == "" {
		opts.Template = "default" // a pool or a snapshot names its template
	}
	idle, err := f.timers.apply(&opts.OnDeadline, &opts.OnIdle)
	if err != nil {
		return opts, err
	}
	if idle != nil {
		opts.IdleTimeout = *idle
	}
	if opts.MemoryMB, err = parseMB("memory", f.memory); err != nil {
		return opts, err
	}
	if opts.DiskMB, err = parseMB("disk", f.disk); err != nil {
		return opts, err
	}
	if f.timeout != "" {
		d, err := parseDuration(f.timeout)
		if err != nil {
			return opts, err
		}
		opts.Timeout = &d
	}
	if opts.Env, err = f.env.pairs("-e"); err != nil {
		return opts, err
	}
	if opts.Metadata, err = f.metadata.pairs("--metadata"); err != nil {
		return opts, err
	}
	return opts, nil
}

// parseMB parses a size like 512M, 2G, 1.5G, 64Mi or 1048576 (bytes) and
// returns whole MiB, rounding up.
func parseMB(name, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	num := strings.TrimRight(strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(s), "IB"), "B"), "I")
	mult := 1.0
	if n := len(num); n > 0 {
		switch num[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			num = num[:n-1]
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("invalid %s %q: use a size like 512M or 2G", name, s)
	}
	bytes := v * mult
	return int64((bytes + (1<<20 - 1)) / (1 << 20)), nil
}

// parseDuration accepts Go durations (10m, 1h30m) and plain seconds.
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("invalid duration %q: use e.g. 30s, 10m or 2h", s)
	}
	return d, nil
}

// multiFlag collects a repeatable KEY=VALUE flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func (m multiFlag) pairs(flagName string) (map[string]string, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(m))
	for _, kv := range m {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q must be KEY=VALUE", flagName, kv)
		}
		out[k] = v
	}
	return out, nil
}
