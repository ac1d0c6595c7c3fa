package testutil

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Etcd is a single-member etcd server on 127.0.0.1 run for one test, with
// its data in a temporary directory.
type Etcd struct {
	// Endpoint is its client URL.
	Endpoint string
	bin      string
	args     []string
	log      string
	cmd      *exec.Cmd
	exited   chan struct{}
}

// StartEtcd starts Debian's etcd (package etcd-server) on free loopback
// ports, waits until it answers, and stops it when the test ends. It
// skips (or fails under CORRAL_TEST_REQUIRE=1) when etcd is not on PATH.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	bin := RequiresBinary(t, "etcd")
	dir := t.TempDir()
	client, peer := freePort(t), freePort(t)
	clientURL, peerURL := "http://"+client, "http://"+peer
	e := &Etcd{
		Endpoint: clientURL,
		bin:      bin,
		log:      filepath.Join(dir, "etcd.log"),
		args: []string{
			"--name", "test", "--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "test=" + peerURL,
		},
	}
	t.Cleanup(func() {
		e.Stop(t)
		if t.Failed() {
			if b, err := os.ReadFile(e.log); err == nil {
				t.Logf("etcd log:\n%s", lastLines(string(b), 40))
			}
		}
	})
	e.Start(t)
	return e
}

// Start starts the server again after Stop, on the same ports and data.
func (e *Etcd) Start(t testing.TB) {
	t.Helper()
	if e.cmd != nil {
		t.Fatal("etcd is already running")
	}
	log, err := os.OpenFile(e.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(e.bin, e.args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	e.cmd, e.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(e.exited)
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-e.exited:
			t.Fatalf("etcd exited while starting; its log is %s", e.log)
		default:
		}
		if healthy(e.Endpoint) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("etcd did not become healthy within 20s")
		}
	}
}

// Stop stops the server it started (SIGTERM, then SIGKILL after 10s) and
// waits for it to exit. Its data stays for Start.
func (e *Etcd) Stop(t testing.TB) {
	t.Helper()
	if e.cmd == nil {
		return
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
	e.cmd = nil
}

func healthy(endpoint string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(endpoint + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 512)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return resp.StatusCode == http.StatusOK && strings.Contains(b.String(), `"health":"true"`)
}

// freePort returns a 127.0.0.1:PORT that was free a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
