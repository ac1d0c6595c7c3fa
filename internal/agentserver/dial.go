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
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/agentdialout"
)

// ServeDialing serves h to a daemon that the agent reaches by dialing the
// unix socket at path (from inside the sandbox), or by opening path when
// it is a character device (a VM's virtio-serial port, whose host end is
// the daemon's socket), for runtimes where the agent cannot accept
// connections from the host (gVisor) or has one stream only (VMs). Over each connection it runs a yamux session in which
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
		c, err := dial(ctx, path)
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

// dial connects to the daemon at path: a unix socket, or a character
// device (a virtio-serial port). A port opens whether or not its host end
// is connected, and then reads as end of file, so a port whose host end
// is not there (poll reports POLLHUP) counts as a refused connection, and
// the caller backs off before it tries again.
func dial(ctx context.Context, path string) (io.ReadWriteCloser, error) {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	// Through the raw descriptor: File.Fd would make the file blocking,
	// and Close could then not end a read in progress.
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	var revents int16
	cerr := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}
		_, err = unix.Poll(fds, 0)
		revents = fds[0].Revents
	})
	if err = errors.Join(cerr, err); err != nil {
		f.Close()
		return nil, fmt.Errorf("polling %s: %w", path, err)
	}
	if revents&unix.POLLHUP != 0 {
		f.Close()
		return nil, fmt.Errorf("%s: host end not connected", path)
	}
	return f, nil
}
