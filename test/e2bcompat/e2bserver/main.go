// Command e2bserver is `corral server` with the E2B facade served on its
// own TCP listener, wired exactly as docs/E2B.md tells the daemon to mount
// it. The compatibility tests run it; it is not part of the product.
package main

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
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/daemon"
	"github.com/corralrun/corral/internal/e2b"
)

func main() {
	os.Exit(run())
}

func run() int {
	var cfg daemon.Config
	fs := flag.NewFlagSet("e2bserver", flag.ContinueOnError)
	fs.StringVar(&cfg.StateDir, "state-dir", "", "state directory")
	fs.StringVar(&cfg.Socket, "socket", "", "unix socket of Corral's own API")
	fs.StringVar(&cfg.Storage, "storage", "overlay", "storage backend")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "", "cgroup parent of the sandboxes")
	fs.StringVar(&cfg.AgentPath, "agent", "", "the corral binary, run as the in-sandbox agent")
	fs.StringVar(&cfg.APIKey, "api-key", "", "API key of the E2B API")
	e2bListen := fs.String("e2b-listen", "127.0.0.1:0", "address of the E2B API")
	addrFile := fs.String("addr-file", "", "file to write the E2B API's address to once it serves")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Logger = log

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		log.Error("starting daemon", "err", err)
		return 1
	}
	defer d.Stop(context.Background())

	facade := e2b.New(e2b.Config{Manager: d.Manager(), APIKey: cfg.APIKey, Logger: log})
	l, err := net.Listen("tcp", *e2bListen)
	if err != nil {
		_ = facade.Close()
		log.Error("listening for the E2B API", "err", err)
		return 1
	}
	srv := &http.Server{Handler: facade.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(l.Addr().String()), 0o600); err != nil {
			log.Error("writing address", "err", err)
			return 1
		}
	}
	code := 0
	select {
	case <-ctx.Done():
	case err := <-d.Err():
		log.Error("daemon stopped", "err", err)
		code = 1
	case err := <-errc:
		log.Error("E2B API stopped", "err", err)
		code = 1
	}
	// Streams first: the HTTP server's shutdown waits for them.
	_ = facade.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "shutting down the E2B API:", err)
	}
	return code
}
