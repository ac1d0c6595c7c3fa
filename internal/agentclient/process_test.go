package agentclient_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// processCalls is one call of every process and tree method, for tests
// that check what all of them do with one kind of answer.
func processCalls(ctx context.Context, c *agentclient.Client) []struct {
	name string
	call func() error
} {
	noop := func(wire.ExecEvent) error { return nil }
	return []struct {
		name string
		call func() error
	}{
		{"start", func() error {
			_, err := c.StartProcess(ctx, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"x"}}})
			return err
		}},
		{"processes", func() error { _, err := c.Processes(ctx); return err }},
		{"process", func() error { _, err := c.Process(ctx, 7); return err }},
		{"output", func() error { return c.ProcessOutput(ctx, 7, 0, true, noop) }},
		{"write stdin", func() error { return c.WriteStdin(ctx, 7, strings.NewReader("x")) }},
		{"close stdin", func() error { return c.CloseStdin(ctx, 7) }},
		{"signal", func() error { return c.Signal(ctx, 7, "TERM") }},
		{"resize", func() error { return c.Resize(ctx, 7, wire.PTYSize{Cols: 80, Rows: 24}) }},
		{"wait", func() error { _, err := c.Wait(ctx, 7); return err }},
		{"remove process", func() error { return c.RemoveProcess(ctx, 7) }},
		{"read archive", func() error {
			rc, err := c.ReadArchive(ctx, "/d")
			if err == nil {
				rc.Close()
			}
			return err
		}},
		{"write archive", func() error { return c.WriteArchive(ctx, "/d", strings.NewReader("x")) }},
		{"watch", func() error { return c.Watch(ctx, "/d", true, func(wire.WatchEvent) error { return nil }) }},
	}
}

func TestProcessErrorsKeepKind(t *testing.T) {
	kinds := []error{errdefs.ErrNotFound, errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted, errdefs.ErrInvalidArgument}
	var next atomic.Int32
	c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := kinds[int(next.Load())%len(kinds)]
		wire.WriteError(w, errdefs.Errorf(kind, "agent says %s on %s %s", kind, r.Method, r.URL.Path))
	}))
	for i, tt := range processCalls(t.Context(), c) {
		t.Run(tt.name, func(t *testing.T) {
			next.Store(int32(i))
			want := kinds[i%len(kinds)]
			err := tt.call()
			if !errors.Is(err, want) || !strings.HasPrefix(err.Error(), "agent says ") {
				t.Fatalf("error = %v, want kind %v with the agent's message", err, want)
			}
		})
	}
}

func TestProcessDialFailureIsUnavailable(t *testing.T) {
	c := agentclient.New(func(context.Context) (net.Conn, error) { return nil, errors.New("no route to sandbox") })
	defer c.Close()
	for _, tt := range processCalls(t.Context(), c) {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("error = %v, want unavailable", err)
			}
		})
	}
}

func TestProcessOutputStream(t *testing.T) {
	tests := []struct {
		name       string
		follow     bool
		body       string
		wantEvents []string
		wantErr    error
	}{
		{
			name:       "follow to exit",
			follow:     true,
			body:       `{"type":"start","pid":7}` + "\n" + `{"type":"stdout","text":"hi","offset":3}` + "\n" + `{"type":"exit","exit_code":0}` + "\n",
			wantEvents: []string{"start", "stdout@3", "exit"},
		},
		{
			name:       "no follow ends cleanly without exit",
			body:       `{"type":"start","pid":7}` + "\n" + `{"type":"stdout","text":"hi"}` + "\n",
			wantEvents: []string{"start", "stdout@0"},
		},
		{
			name:       "follow ends without exit",
			follow:     true,
			body:       `{"type":"start","pid":7}` + "\n",
			wantEvents: []string{"start"},
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
			follow:     true,
			body:       `{"type":"start","pid":7}` + "\n" + `{"type":"error","error":{"code":"internal","message":"lost"}}` + "\n",
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
			c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/processes/7/output" || r.URL.Query().Get("from") != "5" {
					t.Errorf("request %s", r.URL)
				}
				io.WriteString(w, tt.body)
			}))
			var got []string
			err := c.ProcessOutput(t.Context(), 7, 5, tt.follow, func(ev wire.ExecEvent) error {
				if ev.Type == wire.EventStdout {
					got = append(got, ev.Type+"@"+strconv.FormatInt(ev.Offset, 10))
					return nil
				}
				got = append(got, ev.Type)
				return nil
			})
			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantEvents, got); diff != "" {
				t.Fatalf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// WriteStdin sends each read of its reader at once: the agent sees the
// first bytes while the body is still open.
func TestWriteStdinStreams(t *testing.T) {
	gotFirst := make(chan string, 1)
	c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 64)
		n, _ := r.Body.Read(buf)
		gotFirst <- string(buf[:n])
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- c.WriteStdin(t.Context(), 7, pr) }()
	pw.Write([]byte("typed"))
	select {
	case got := <-gotFirst:
		if got != "typed" {
			t.Fatalf("agent read %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the agent did not get the first bytes while the body was open")
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Watch and a following ProcessOutput end when ctx does, and the agent
// sees the request end.
func TestStreamsStopOnCancel(t *testing.T) {
	ended := make(chan string, 2)
	c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/processes") {
			io.WriteString(w, `{"type":"start","pid":7}`+"\n")
		} else {
			io.WriteString(w, `{"type":"create","path":"/d/x","time":"2024-01-01T00:00:00Z"}`+"\n")
		}
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
		ended <- r.URL.Path
	}))
	for _, tt := range []struct {
		name string
		run  func(ctx context.Context, cancel func()) error
	}{
		{"output", func(ctx context.Context, cancel func()) error {
			return c.ProcessOutput(ctx, 7, 0, true, func(wire.ExecEvent) error { cancel(); return nil })
		}},
		{"watch", func(ctx context.Context, cancel func()) error {
			return c.Watch(ctx, "/d", true, func(wire.WatchEvent) error { cancel(); return nil })
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if err := tt.run(ctx, cancel); !errors.Is(err, context.Canceled) {
				t.Fatalf("error = %v, want canceled", err)
			}
			select {
			case <-ended:
			case <-time.After(5 * time.Second):
				t.Fatal("the agent did not see the request end")
			}
		})
	}
}

// The whole surface against a real agent: start, follow, stdin, wait,
// archive both ways, watch.
func TestProcessesAgainstAgent(t *testing.T) {
	root := t.TempDir()
	srv := agentserver.NewServer(agentserver.Options{Root: root})
	defer srv.Close()
	c, dials := serve(t, srv.Handler())
	ctx := t.Context()

	info, err := c.StartProcess(ctx, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"cat"}}, OpenStdin: true, Tag: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, info.PID, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, info.PID); err != nil {
		t.Fatal(err)
	}
	final, err := c.Wait(ctx, info.PID)
	if err != nil || final.ExitCode == nil || *final.ExitCode != 0 || final.Tag != "t" {
		t.Fatalf("Wait = %+v, %v", final, err)
	}
	var out bytes.Buffer
	if err := c.ProcessOutput(ctx, info.PID, 0, true, func(ev wire.ExecEvent) error {
		out.Write(ev.Bytes())
		return nil
	}); err != nil || out.String() != "hello" {
		t.Fatalf("output %q, %v", out.String(), err)
	}
	list, err := c.Processes(ctx)
	if err != nil || len(list) != 1 || list[0].PID != info.PID {
		t.Fatalf("Processes = %+v, %v", list, err)
	}
	if err := c.RemoveProcess(ctx, info.PID); err != nil {
		t.Fatal(err)
	}

	if err := os.MkdirAll(filepath.Join(root, "src", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "src", "d", "f"), []byte("file"), 0o640); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ReadArchive(ctx, "/src")
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	io.Copy(&archive, rc)
	rc.Close()
	if err := c.WriteArchive(ctx, "/dst", &archive); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "dst", "d", "f")); err != nil || string(b) != "file" {
		t.Fatalf("extracted file: %q, %v", b, err)
	}
	var bad bytes.Buffer
	tw := tar.NewWriter(&bad)
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	if err := c.WriteArchive(ctx, "/dst", &bad); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `"../escape"`) {
		t.Fatalf("escaping upload: %v", err)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seen := make(chan wire.WatchEvent, 16)
	watched := make(chan error, 1)
	go func() {
		watched <- c.Watch(wctx, "/dst", true, func(ev wire.WatchEvent) error {
			seen <- ev
			return nil
		})
	}()
	deadline := time.After(10 * time.Second)
	for found := false; !found; {
		os.WriteFile(filepath.Join(root, "dst", "d", "new"), nil, 0o644)
		select {
		case ev := <-seen:
			found = ev.Path == "/dst/d/new"
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("no watch event")
		}
	}
	cancel()
	if err := <-watched; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch = %v, want canceled", err)
	}
	if n := dials.Load(); n > 3 {
		t.Fatalf("dialed %d connections", n)
	}
}
