package agentclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// serve runs h on a unix socket and returns a client for it and a counter
// of the connections it dialed.
func serve(t *testing.T, h http.Handler) (*agentclient.Client, *atomic.Int32) {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var dials atomic.Int32
	var d net.Dialer
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hs.Shutdown(ctx)
		<-served
		os.RemoveAll(dir)
	})
	return c, &dials
}

func TestDialFailureIsUnavailable(t *testing.T) {
	c := agentclient.New(func(context.Context) (net.Conn, error) { return nil, errors.New("no route to sandbox") })
	defer c.Close()
	_, err := c.Health(t.Context())
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "no route to sandbox") {
		t.Fatalf("Health error = %v, want unavailable with the cause", err)
	}
	err = c.Exec(t.Context(), wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil })
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Exec error = %v, want unavailable", err)
	}
}

// Error bodies keep their kind and message across the wire, for every
// method.
func TestAgentErrorsKeepKind(t *testing.T) {
	kinds := []error{errdefs.ErrNotFound, errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted, errdefs.ErrInvalidArgument}
	var next atomic.Int32
	c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := kinds[int(next.Load())%len(kinds)]
		wire.WriteError(w, errdefs.Errorf(kind, "agent says %s on %s", kind, r.URL.Path))
	}))
	ctx := t.Context()
	calls := []struct {
		name string
		call func() error
	}{
		{"exec", func() error {
			return c.Exec(ctx, wire.ExecRequest{Cmd: []string{"x"}}, func(wire.ExecEvent) error { return nil })
		}},
		{"read", func() error { _, _, err := c.ReadFile(ctx, "/f"); return err }},
		{"write", func() error { _, err := c.WriteFile(ctx, "/f", 0o644, strings.NewReader("x")); return err }},
		{"stat", func() error { _, err := c.Stat(ctx, "/f"); return err }},
		{"list", func() error { _, err := c.List(ctx, "/f"); return err }},
		{"mkdir", func() error { _, err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/f"}); return err }},
		{"remove", func() error { return c.Remove(ctx, "/f", true) }},
		{"rename", func() error { _, err := c.Rename(ctx, "/f", "/g"); return err }},
		{"health", func() error { _, err := c.Health(ctx); return err }},
	}
	for i, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			next.Store(int32(i))
			want := kinds[i%len(kinds)]
			err := tt.call()
			if !errors.Is(err, want) {
				t.Fatalf("error = %v, want kind %v", err, want)
			}
			if !strings.HasPrefix(err.Error(), "agent says ") {
				t.Fatalf("message = %q, want the agent's message unchanged", err)
			}
		})
	}
}

// streamHandler answers /exec with body, then ends the response.
func streamHandler(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, body)
	})
}

func TestExecStream(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		wantEvents []string
		wantErr    error
	}{
		{
			name:       "complete",
			body:       `{"type":"start","pid":7}` + "\n" + `{"type":"stdout","text":"hi"}` + "\n" + `{"type":"exit","exit_code":0}` + "\n",
			wantEvents: []string{"start", "stdout", "exit"},
		},
		{
			name:       "ends without exit",
			body:       `{"type":"start","pid":7}` + "\n" + `{"type":"stdout","text":"hi"}` + "\n",
			wantEvents: []string{"start", "stdout"},
			wantErr:    errdefs.ErrUnavailable,
		},
		{
			name:       "cut mid-line",
			body:       `{"type":"start","pid":7}` + "\n" + `{"type":"std`,
			wantEvents: []string{"start"},
			wantErr:    errdefs.ErrUnavailable,
		},
		{
			name:       "error event",
			body:       `{"type":"start","pid":7}` + "\n" + `{"type":"error","error":{"code":"internal","message":"exit status lost"}}` + "\n",
			wantEvents: []string{"start"},
			wantErr:    errdefs.ErrInternal,
		},
		{
			name:    "malformed",
			body:    "not json\n",
			wantErr: errdefs.ErrInternal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := serve(t, streamHandler(tt.body))
			var got []string
			err := c.Exec(t.Context(), wire.ExecRequest{Cmd: []string{"x"}}, func(ev wire.ExecEvent) error {
				got = append(got, ev.Type)
				return nil
			})
			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Exec error = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantEvents, got); diff != "" {
				t.Fatalf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// Canceling ctx mid-stream tears the request down, which the agent sees.
func TestExecCancelReachesAgent(t *testing.T) {
	agentSaw := make(chan struct{})
	c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req wire.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"type":"start","pid":7}`+"\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
		close(agentSaw)
	}))
	ctx, cancel := context.WithCancel(t.Context())
	err := c.Exec(ctx, wire.ExecRequest{Cmd: []string{"sleep"}}, func(ev wire.ExecEvent) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec error = %v, want context.Canceled", err)
	}
	select {
	case <-agentSaw:
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not see the request end")
	}
}

// Requests reuse one connection, exec streams included.
func TestConnectionReuse(t *testing.T) {
	srv := agentserver.NewServer(agentserver.Options{Root: t.TempDir()})
	defer srv.Close()
	c, dials := serve(t, srv.Handler())
	ctx := t.Context()
	for range 5 {
		if _, err := c.Health(ctx); err != nil {
			t.Fatal(err)
		}
		var code int
		err := c.Exec(ctx, wire.ExecRequest{Shell: "echo hi; exit 3"}, func(ev wire.ExecEvent) error {
			if ev.Type == wire.EventExit {
				code = *ev.ExitCode
			}
			return nil
		})
		if err != nil || code != 3 {
			t.Fatalf("Exec: %v, code %d", err, code)
		}
		if _, err := c.WriteFile(ctx, "/f", 0o600, strings.NewReader("data")); err != nil {
			t.Fatal(err)
		}
		rc, size, err := c.ReadFile(ctx, "/f")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "data" || size != 4 {
			t.Fatalf("ReadFile = %q, size %d", b, size)
		}
		if _, err := c.Stat(ctx, "/nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("Stat: %v", err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("dialed %d connections, want 1", n)
	}
}
