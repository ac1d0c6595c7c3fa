package agentserver

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/corralrun/corral/internal/agentdialout"
)

// ServeDialing serves h to a daemon that the agent reaches by dialing the
// unix socket at path (from inside the sandbox), for runtimes where the
// agent cannot accept connections from the host (gVisor) or has one
// stream only (VMs). Over each connection it runs a yamux session in which
// the daemon opens one stream per request. When the connection breaks (the
// daemon restarted, the sandbox was restored from a checkpoint), it dials
// again, backing off up to one second, until ctx ends. connected is called
// after every successful dial; the first call means the agent is ready.
//
// Every value from redial (may be nil) drops the current connection and
// dials again at once. A gVisor sandbox that was checkpointed and left
// running has a connection that neither end sees fail until the next
// keep-alive, seconds later; the driver then signals the agent (SIGHUP).
func ServeDialing(ctx context.Context, path string, h http.Handler, log *slog.Logger, connected func(), redial <-chan os.Signal) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		sess, err := yamux.Server(c, agentdialout.Config())
		if err != nil {
			c.Close()
			continue
		}
		if connected != nil {
			connected()
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		stop := context.AfterFunc(ctx, func() { srv.Close() })
		served := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			select {
			case <-redial:
				log.Info("told to dial again", "socket", path)
				sess.Close()
			case <-served:
			}
		})
		err = srv.Serve(sess)
		close(served)
		wg.Wait()
		stop()
		sess.Close()
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !sess.IsClosed() {
			log.Warn("serving the daemon connection", "error", err)
		}
		log.Info("daemon connection closed; dialing again", "socket", path)
	}
	return ctx.Err()
}
