// Package cli implements the corral command line: the client commands built
// on the public SDK, plus dispatch to the daemon and the agent. It parses
// flags and prints; it makes no decisions a user of the API could not make.
//
// The command table (table.go) lists every command once: the help is
// generated from it, and cobra dispatches through it and writes the shell
// completion scripts. Each command parses its own flags with the flag
// package, so that cobra changes neither their syntax nor their errors.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

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
		writeUsage(env.Stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "agent":
		// Before the command table is built: the agent is the first
		// process of every sandbox, and its start pays for none of the CLI.
		return agent(args[1:])
	case "-h", "--help":
		name = "help"
	case "--version":
		name = "version"
	}
	c := &cli{env: env, serverMain: server, agentMain: agent}
	table := commands()
	if !known(table, name) {
		fmt.Fprintf(env.Stderr, "corral: unknown command %q\n", name)
		writeUsage(env.Stderr)
		return exitUsage
	}
	code := 0
	c.root = c.newRoot(table, &code)
	c.root.SetArgs(append([]string{name}, args[1:]...))
	if err := c.root.Execute(); err != nil {
		fmt.Fprintf(env.Stderr, "corral: %v\n", err)
		return exitUsage
	}
	return code
}

// known says whether name is a command of the table, or one that cobra
// adds (help, and the hidden requests of the completion scripts).
func known(table []command, name string) bool {
	switch name {
	case "help", cobra.ShellCompRequestCmd, cobra.ShellCompNoDescRequestCmd:
		return true
	}
	return slices.ContainsFunc(table, func(cmd command) bool { return cmd.name == name })
}

type cli struct {
	env                   Env
	serverMain, agentMain func(args []string) int
	root                  *cobra.Command // for the completion scripts
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
	volumes           volumeFlag
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
	fs.Var(&f.volumes, "v", "mount a host directory as `SRC:DST[:MODE]`; SRC absolute or ./relative, MODE ro, rw (default) or cow (repeatable; the daemon must allow SRC)")
	fs.Var(&f.volumes, "volume", "same as -v `SRC:DST[:MODE]`")
}

func (f *createFlags) options() (corral.CreateOptions, error) {
	opts := corral.CreateOptions{Template: f.template, Runtime: f.runtime, CPUs: f.cpus, Pids: f.pids,
		Pool: f.pool, FromSnapshot: f.fromSnapshot, Mounts: f.volumes.mounts}
	var err error
	if opts.Network, err = f.net.policy(); err != nil {
		return opts, err
	}
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
