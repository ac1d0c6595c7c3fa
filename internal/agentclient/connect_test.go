package agentclient_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/corralrun/corral/internal/agentserver"
	"github.com/corralrun/corral/internal/errdefs"
)

// TestConnect carries a TCP connection to a port "inside" (the agent runs
// in the test's own network namespace here) through the agent, half
// closes included; a closed port and a bad one are clear errors.
func TestConnect(t *testing.T) {
	srv := agentserver.NewServer(agentserver.Options{Root: t.TempDir()})
	defer srv.Close()
	c, _ := serve(t, srv.Handler())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		b, _ := io.ReadAll(conn) // until the client's half close
		conn.Write(append([]byte("echo: "), b...))
	})
	port := ln.Addr().(*net.TCPAddr).Port
	conn, err := c.Connect(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "echo: hello" {
		t.Fatalf("read %q, %v", got, err)
	}

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	for _, tt := range []struct {
		name string
		port int
		kind error
		want string
	}{
		{"nothing listens", closedPort, errdefs.ErrUnavailable, "nothing listens on port"},
		{"port out of range", 70000, errdefs.ErrInvalidArgument, "want a number from 1 to 65535"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Connect(t.Context(), tt.port)
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Connect: %v; want %v saying %q", err, tt.kind, tt.want)
			}
		})
	}
}
