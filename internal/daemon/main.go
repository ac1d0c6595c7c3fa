package daemon

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Main runs `corral server` with args and returns the exit code: it parses
// flags into a Config, starts the daemon, and stops it on SIGINT or SIGTERM.
func Main(args []string, version string) int {
	fs := flag.NewFlagSet("corral server", flag.ContinueOnError)
	var cfg Config
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/corral", "state directory (database, storage, runtime state)")
	fs.StringVar(&cfg.Socket, "socket", "/run/corral/corral.sock", "root-only unix socket of the API")
	fs.StringVar(&cfg.Listen, "listen", "", "also serve the API on HOST:PORT (needs an API key)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("CORRAL_API_KEY"), "API key required on --listen (default $CORRAL_API_KEY)")
	fs.StringVar(&cfg.Storage, "storage", "btrfs", "storage backend: btrfs or overlay")
	fs.StringVar(&cfg.Runtime, "runtime", "runc", "default runtime")
	fs.StringVar(&cfg.RuncPath, "runc", "", "runc binary (default: from PATH)")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "/corral", "cgroup that holds one cgroup per sandbox")
	fs.DurationVar(&cfg.DefaultTimeout, "default-timeout", 5*time.Minute, "sandbox lifetime when a create names none")
	fs.DurationVar(&cfg.MaxTimeout, "max-timeout", 0, "longest allowed sandbox lifetime (0: no limit, and sandboxes without deadline are allowed)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "corral server: unexpected arguments %v\n", fs.Args())
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "corral server: invalid --log-level %q\n", *logLevel)
		return 2
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Version = version

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := Start(ctx, cfg)
	if err != nil {
		cfg.Logger.Error("starting daemon", "err", err)
		return 1
	}
	code := 0
	select {
	case <-ctx.Done():
	case err := <-d.Err():
		cfg.Logger.Error("daemon stopped", "err", err)
		code = 1
	}
	d.Stop(context.Background())
	cfg.Logger.Info("corral daemon stopped")
	return code
}
