package agentdialout_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/corralrun/corral/internal/agentdialout"
	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "ac-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func get(t *testing.T, l *agentdialout.Listener, path string) string {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return l.Dial(ctx) }}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://agent"+path, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestDialOutAndReconnect(t *testing.T) {
	sock := filepath.Join(shortDir(t), "agent.sock")
	l, err := agentdialout.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.URL.Path) })
	ctx, cancel := context.WithCancel(context.Background())
	var connects sync.WaitGroup
	connects.Add(2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = agentserver.ServeDialing(ctx, sock, h, nil, func() { connects.Done() }, nil)
	}()
	defer func() { cancel(); wg.Wait() }()

	if err := l.WaitConnected(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Concurrent requests share the one connection.
	var reqs sync.WaitGroup
	for i := 0; i < 8; i++ {
		reqs.Add(1)
		go func() {
			defer reqs.Done()
			if got := get(t, l, "/x"); got != "hello /x" {
				t.Errorf("got %q", got)
			}
		}()
	}
	reqs.Wait()

	// The daemon restarts: its listener goes away and comes back on the
	// same path; the agent dials again.
	l.Close()
	l2, err := agentdialout.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if got := get(t, l2, "/again"); got != "hello /again" {
		t.Fatalf("after reconnect got %q", got)
	}
	connects.Wait()
}

func TestDialWaitsAndTimesOut(t *testing.T) {
	sock := filepath.Join(shortDir(t), "agent.sock")
	l, err := agentdialout.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = l.Dial(ctx)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "waiting for the agent") {
		t.Fatalf("dial without agent: %v", err)
	}
	l.Close()
	if _, err := l.Dial(t.Context()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("dial after close: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after close: %v", err)
	}
}

// TestRedialAndDrop: a redial signal makes the agent drop its connection
// and dial again; Drop makes the daemon's end wait for the next one.
func TestRedialAndDrop(t *testing.T) {
	sock := filepath.Join(shortDir(t), "agent.sock")
	l, err := agentdialout.Listen(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	ctx, cancel := context.WithCancel(context.Background())
	var connects atomic.Int32
	redial := make(chan os.Signal, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = agentserver.ServeDialing(ctx, sock, h, nil, func() { connects.Add(1) }, redial)
	})
	defer func() { cancel(); wg.Wait() }()
	waitConnects := func(n int32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for connects.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections, want %d", connects.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
		if got := get(t, l, "/"); got != "ok" {
			t.Fatalf("got %q", got)
		}
	}
	waitConnects(1)
	redial <- syscall.SIGHUP
	waitConnects(2)
	l.Drop()
	if err := l.WaitConnected(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitConnects(3)
}
