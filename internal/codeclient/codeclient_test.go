package codeclient

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/interpreter"
	"github.com/corralrun/corral/internal/wire"
)

// fakeService serves handler to the client as the interpreter of every
// sandbox, over in-memory connections.
func fakeService(t *testing.T, handler http.HandlerFunc) *Client {
	ln := newPipeListener()
	srv := &http.Server{Handler: handler}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return New(func(ctx context.Context, id string, port int) (net.Conn, error) {
		if id == "none" {
			return nil, errdefs.Errorf(errdefs.ErrUnavailable, "nothing listens on port %d", port)
		}
		if port != interpreter.Port {
			t.Errorf("dialed port %d", port)
		}
		return ln.dial()
	})
}

func TestExecute(t *testing.T) {
	c := fakeService(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/execute":
			w.Write([]byte(`{"type":"stdout","text":"hi\n"}` + "\n" + `{"type":"keepalive"}` + "\n" +
				`{"type":"result","text":"2","is_main_result":true}` + "\n" + `{"type":"end_of_execution"}` + "\n"))
		case "/contexts/nope":
			wire.WriteError(w, errdefs.Errorf(errdefs.ErrNotFound, "context nope not found"))
		}
	})
	var got []string
	err := c.Execute(t.Context(), "sb", interpreter.ExecuteRequest{Code: "1+1"}, func(e interpreter.Event) error {
		got = append(got, e.Type+":"+e.Text+stringOf(e.Result["text"]))
		return nil
	})
	if err != nil || strings.Join(got, ",") != "stdout:hi\n,result:2,end_of_execution:" {
		t.Fatalf("events %q, error %v", got, err)
	}
	if err := c.DeleteContext(t.Context(), "sb", "nope"); errdefs.Code(err) != errdefs.CodeNotFound {
		t.Errorf("unknown context: %v", err)
	}
	if _, err := c.Contexts(t.Context(), "none"); errdefs.Code(err) != errdefs.CodeFailedPrecondition || !strings.Contains(err.Error(), "code-interpreter") {
		t.Errorf("sandbox without an interpreter: %v", err)
	}
}

func TestExecuteStreamFaults(t *testing.T) {
	c := fakeService(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("long") != "" || strings.Contains(readAll(r), "long") {
			w.Write([]byte(`{"type":"stdout","text":"` + strings.Repeat("x", MaxLine+10) + `"}` + "\n"))
			return
		}
		w.Write([]byte(`{"type":"stdout","text":"cut"}` + "\n"))
	})
	noop := func(interpreter.Event) error { return nil }
	if err := c.Execute(t.Context(), "sb", interpreter.ExecuteRequest{Code: "short"}, noop); errdefs.Code(err) != errdefs.CodeUnavailable {
		t.Errorf("a stream without its end: %v", err)
	}
	if err := c.Execute(t.Context(), "sb", interpreter.ExecuteRequest{Code: "long"}, noop); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("a line over the limit: %v", err)
	}
}

func stringOf(v any) string { s, _ := v.(string); return s }

func readAll(r *http.Request) string {
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// pipeListener is a net.Listener of in-memory connections.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial() (net.Conn, error) {
	a, b := net.Pipe()
	select {
	case l.conns <- b:
		return a, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "unix"} }
