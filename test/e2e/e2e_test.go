package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// TestRunCLI checks the README's promises with the busybox template:
// output, exit codes and stderr pass through `corral run`.
func TestRunCLI(t *testing.T) {
	forEachStorage(t, func(t *testing.T, storage string) {
		d := startDaemon(t, storage)
		tests := []struct {
			name     string
			args     []string
			wantOut  string
			wantErr  string
			wantCode int
		}{
			{"output", []string{"sh", "-c", "echo $((6*7))"}, "42\n", "", 0},
			{"exit code", []string{"sh", "-c", "exit 7"}, "", "", 7},
			{"stderr", []string{"sh", "-c", "echo err >&2"}, "", "err\n", 0},
			{"not found", []string{"no-such-command"}, "", "no-such-command", 127},
			{"signal", []string{"sh", "-c", "kill -9 $$"}, "", "", 137},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				args := append([]string{"run", "--template", "bb", "--"}, tt.args...)
				out, errOut, code := d.corral(args...)
				if code != tt.wantCode {
					t.Fatalf("exit code %d, want %d (stdout %q, stderr %q)", code, tt.wantCode, out, errOut)
				}
				if out != tt.wantOut {
					t.Errorf("stdout %q, want %q", out, tt.wantOut)
				}
				if !strings.Contains(errOut, tt.wantErr) {
					t.Errorf("stderr %q does not contain %q", errOut, tt.wantErr)
				}
			})
		}
		// run destroys its sandbox.
		if list, _ := d.Client.List(t.Context(), corral.ListOptions{}); len(list) != 0 {
			t.Fatalf("corral run left sandboxes behind: %v", list)
		}
	})
}

// TestCLILifecycle covers create, exec, ls, inspect, timeout and rm.
func TestCLILifecycle(t *testing.T) {
	d := startDaemon(t, "btrfs")
	out, errOut, code := d.corral("create", "--template", "bb", "--memory", "128M", "--cpus", "0.5", "--timeout", "10m", "-e", "GREETING=hi", "--metadata", "owner=e2e")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	out, errOut, code = d.corral("exec", id, "--", "sh", "-c", "echo $GREETING; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max")
	if code != 0 || !strings.HasPrefix(out, "hi\n") {
		t.Fatalf("exec: code %d out %q err %q", code, out, errOut)
	}
	if !strings.Contains(out, fmt.Sprint(128<<20)) {
		t.Errorf("memory limit not visible in the sandbox's cgroup: %q", out)
	}
	// The daemon runs corral-agent, installed next to it, as the agent.
	lean, err := os.Stat(testutil.AgentBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	out, _, code = d.corral("exec", id, "--", "stat", "-c", "%s", "/.corral/agent")
	if code != 0 || strings.TrimSpace(out) != fmt.Sprint(lean.Size()) {
		t.Errorf("the sandbox's agent is %q bytes, want corral-agent's %d", out, lean.Size())
	}
	out, _, code = d.corral("exec", "-e", "GREETING=override", id, "sh", "-c", "echo $GREETING")
	if code != 0 || out != "override\n" {
		t.Fatalf("exec env override: %d %q", code, out)
	}
	out, _, _ = d.corral("ls", "--metadata", "owner=e2e", "-q")
	if strings.TrimSpace(out) != id {
		t.Fatalf("ls by metadata = %q, want %s", out, id)
	}
	out, _, _ = d.corral("ls", "--metadata", "owner=other", "-q")
	if strings.TrimSpace(out) != "" {
		t.Fatalf("ls by other metadata = %q, want nothing", out)
	}
	out, _, code = d.corral("inspect", id)
	if code != 0 || !strings.Contains(out, `"state": "running"`) || !strings.Contains(out, `"cpus": 0.5`) {
		t.Fatalf("inspect: %d %s", code, out)
	}
	if _, errOut, code = d.corral("timeout", id, "1h"); code != 0 {
		t.Fatalf("timeout: %d %s", code, errOut)
	}
	sb, err := d.Client.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(*sb.Deadline); left < 59*time.Minute || left > time.Hour {
		t.Fatalf("deadline after timeout 1h is %s away", left)
	}
	if _, errOut, code = d.corral("rm", id); code != 0 {
		t.Fatalf("rm: %d %s", code, errOut)
	}
	_, errOut, code = d.corral("rm", id)
	if code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("second rm: code %d, stderr %q", code, errOut)
	}
}

// TestOOMIsReported: a process allocating far past a 64 MiB limit is
// killed, the exec says so, and another sandbox keeps working.
func TestOOMIsReported(t *testing.T) {
	d := startDaemon(t, "btrfs")
	small := d.create(t, corral.CreateOptions{MemoryMB: 64})
	neighbour := d.create(t, corral.CreateOptions{})
	// dd allocates its whole 1 GiB block and fills it from /dev/zero.
	_, res := d.execOut(t, small.ID, "dd if=/dev/zero of=/dev/null bs=1G count=1")
	if !res.OOMKilled {
		t.Fatalf("exec result %+v: want oom_killed", res)
	}
	out, res := d.execOut(t, neighbour.ID, "echo alive")
	if out != "alive\n" || res.ExitCode != 0 {
		t.Fatalf("neighbour: %q %+v", out, res)
	}
	out, res = d.execOut(t, small.ID, "echo still here")
	if out != "still here\n" || res.ExitCode != 0 {
		t.Fatalf("OOM sandbox after the kill: %q %+v", out, res)
	}
	st, err := d.Client.Stats(t.Context(), small.ID)
	if err != nil || st.OOMKills == 0 {
		t.Fatalf("stats %+v, %v: want oom kills", st, err)
	}
	// The CLI says why.
	_, errOut, code := d.corral("exec", small.ID, "--", "dd", "if=/dev/zero", "of=/dev/null", "bs=1G", "count=1")
	if code != 137 || !strings.Contains(errOut, "out of memory") {
		t.Fatalf("CLI OOM: code %d stderr %q", code, errOut)
	}
}

// TestFiles exercises the file API through the SDK.
func TestFiles(t *testing.T) {
	d := startDaemon(t, "overlay")
	sb := d.create(t, corral.CreateOptions{})
	ctx := t.Context()
	c := d.Client
	payload := bytes.Repeat([]byte("corral\x00\xff"), 100000)
	fi, err := c.WriteFile(ctx, sb.ID, "/work/sub/data.bin", bytes.NewReader(payload), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(payload)) || fi.Mode != 0o600 || fi.Type != "file" {
		t.Fatalf("write info %+v", fi)
	}
	r, err := c.ReadFile(ctx, sb.ID, "/work/sub/data.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, payload) {
		t.Fatalf("read back %d bytes, want %d", len(got), len(payload))
	}
	out, _ := d.execOut(t, sb.ID, "wc -c < /work/sub/data.bin")
	if strings.TrimSpace(out) != fmt.Sprint(len(payload)) {
		t.Fatalf("size seen inside: %q", out)
	}
	if _, err := c.Mkdir(ctx, sb.ID, "/work/a/b", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Rename(ctx, sb.ID, "/work/sub/data.bin", "/work/a/b/moved.bin"); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListDir(ctx, sb.ID, "/work/a/b")
	if err != nil || len(list) != 1 || list[0].Name != "moved.bin" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if err := c.Remove(ctx, sb.ID, "/work", false); corral.ErrorCode(err) != corral.CodeFailedPrecondition {
		t.Fatalf("removing a non-empty dir without recursive: %v", err)
	}
	if err := c.Remove(ctx, sb.ID, "/work", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, sb.ID, "/work"); corral.ErrorCode(err) != corral.CodeNotFound {
		t.Fatalf("stat after remove: %v", err)
	}
	if _, err := c.Stat(ctx, sb.ID, "relative/path"); corral.ErrorCode(err) != corral.CodeInvalidArgument {
		t.Fatalf("relative path: %v", err)
	}
}

// TestAPIErrors checks that bad input gets a clear status and code.
func TestAPIErrors(t *testing.T) {
	d := startDaemon(t, "overlay")
	ctx := t.Context()
	c := d.Client
	cases := []struct {
		name string
		err  error
		code string
	}{
		{"unknown template", func() error { _, err := c.Create(ctx, corral.CreateOptions{Template: "nope"}); return err }(), corral.CodeNotFound},
		{"unknown runtime", func() error {
			_, err := c.Create(ctx, corral.CreateOptions{Template: "bb", Runtime: "nope"})
			return err
		}(), corral.CodeInvalidArgument},
		{"tiny memory", func() error { _, err := c.Create(ctx, corral.CreateOptions{Template: "bb", MemoryMB: 1}); return err }(), corral.CodeInvalidArgument},
		{"unknown sandbox", func() error { _, err := c.Get(ctx, "nope"); return err }(), corral.CodeNotFound},
		{"exec unknown sandbox", func() error { _, err := c.Exec(ctx, "nope", corral.ExecOptions{Cmd: []string{"true"}}); return err }(), corral.CodeNotFound},
		{"duplicate template", func() error {
			_, err := c.BuildTemplate(ctx, "bb", corral.BuildOptions{Recipe: "busybox"}, nil)
			return err
		}(), corral.CodeAlreadyExists},
		{"bad template name", func() error {
			_, err := c.BuildTemplate(ctx, "Bad/Name", corral.BuildOptions{Recipe: "busybox"}, nil)
			return err
		}(), corral.CodeInvalidArgument},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			if got := corral.ErrorCode(tt.err); got != tt.code {
				t.Fatalf("error %v has code %q, want %q", tt.err, got, tt.code)
			}
		})
	}
	// Raw HTTP: malformed and unknown fields are rejected with a JSON body.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dd net.Dialer
		return dd.DialContext(ctx, "unix", d.Socket)
	}}}
	for _, body := range []string{`{`, `{"template":"bb","memroy_mb":5}`, ``} {
		resp, err := hc.Post("http://corral/v1/sandboxes", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), `"code":"invalid_argument"`) {
			t.Errorf("body %q: status %d, %s", body, resp.StatusCode, b)
		}
	}
	if list, _ := c.List(ctx, corral.ListOptions{}); len(list) != 0 {
		t.Fatalf("failed creates left sandboxes: %+v", list)
	}
}

// TestDeadline: a sandbox is destroyed when its deadline passes, and
// reading it does not extend the deadline.
func TestDeadline(t *testing.T) {
	d := startDaemon(t, "overlay")
	sb := d.create(t, corral.CreateOptions{Timeout: corral.Timeout(2 * time.Second)})
	first := *sb.Deadline
	for i := 0; i < 3; i++ {
		got, err := d.Client.Get(t.Context(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Deadline.Equal(first) {
			t.Fatalf("deadline moved from %s to %s on read", first, got.Deadline)
		}
		d.execOut(t, sb.ID, "true")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := d.Client.Get(t.Context(), sb.ID)
		if corral.ErrorCode(err) == corral.CodeNotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still there 8s after its deadline: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCrashDuringCreates SIGKILLs the daemon while 10 creates are in
// flight (right after the k-th one succeeded), restarts it, and checks that
// each sandbox is either usable or gone, and that nothing leaked.
func TestCrashDuringCreates(t *testing.T) {
	forEachStorage(t, func(t *testing.T, storage string) {
		for _, k := range []int{1, 5} {
			t.Run(fmt.Sprintf("after %d", k), func(t *testing.T) {
				crashDuringCreates(t, storage, k)
			})
		}
	})
}

func crashDuringCreates(t *testing.T, storage string, k int) {
	d := startDaemon(t, storage)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		succeeded []string
		killed    = make(chan struct{})
		once      sync.Once
	)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			sb, err := d.Client.Create(ctx, corral.CreateOptions{Template: "bb"})
			if err != nil {
				return
			}
			mu.Lock()
			succeeded = append(succeeded, sb.ID)
			n := len(succeeded)
			mu.Unlock()
			if n == k {
				once.Do(func() { d.Kill(); close(killed) })
			}
		}()
	}
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("creates did not succeed")
	}
	wg.Wait()
	d.Start()
	list, err := d.Client.List(t.Context(), corral.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	t.Logf("%d creates answered before the kill; %d of 10 sandboxes exist after restart", len(succeeded), len(list))
	for _, id := range succeeded {
		if _, err := d.Client.Get(t.Context(), id); err != nil {
			t.Errorf("sandbox %s was created before the crash but is gone: %v", id, err)
		}
	}
	mu.Unlock()
	if len(list) == 10 {
		t.Log("no create was interrupted this time")
	}
	for _, sb := range list {
		if sb.State != "running" {
			t.Errorf("sandbox %s is %s after restart, want running or gone", sb.ID, sb.State)
			continue
		}
		out, res := d.execOut(t, sb.ID, "echo ok")
		if out != "ok\n" || res.ExitCode != 0 {
			t.Errorf("sandbox %s after restart: %q %+v", sb.ID, out, res)
		}
	}
	// Half-made roots and runc containers must be gone already.
	entries, _ := os.ReadDir(filepath.Join(d.RunDir, "runc", "sandboxes"))
	if len(entries) != len(list) {
		t.Errorf("%d driver dirs for %d sandboxes", len(entries), len(list))
	}
	roots, _ := os.ReadDir(rootsDir(d))
	if len(roots) != len(list) {
		t.Errorf("%d storage roots for %d sandboxes", len(roots), len(list))
	}
}

// rootsDir is where the daemon's storage keeps sandbox roots.
func rootsDir(d *daemon) string {
	if d.Storage == "overlay" {
		return filepath.Join(d.StateDir, "overlay", "roots")
	}
	return filepath.Join(d.StateDir, "storage", "mnt", "roots")
}

// TestSecondDaemonLeavesFirstAlone starts a second daemon on the state dir
// of a running, idle one: it must refuse to start, and leave the first
// one's run dir and cgroup parent as they were (a daemon that fails to
// start removes nothing).
func TestSecondDaemonLeavesFirstAlone(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	if err := d.Client.Delete(t.Context(), d.create(t, corral.CreateOptions{}).ID); err != nil {
		t.Fatal(err)
	}
	cgroup := filepath.Join("/sys/fs/cgroup/memory", d.Cgroup) // cgroup v1
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		cgroup = filepath.Join("/sys/fs/cgroup", d.Cgroup) // v2
	}
	if _, err := os.Stat(cgroup); err != nil {
		t.Fatalf("cgroup parent after a sandbox: %v", err)
	}
	// What a stopping daemon removes: its directories and its lock. (The
	// files in them come and go with the deleted sandbox's background
	// network teardown and the spares' refills, and so do the spare user
	// namespaces' marker directories, made 200 ms after a create.)
	spares := filepath.Join(d.RunDir, "runc", "userns-spares")
	skeleton := func() string {
		var out []string
		for _, p := range testutil.Files(t, d.RunDir) {
			if p == spares || strings.HasPrefix(p, spares+"/") {
				continue
			}
			if fi, err := os.Lstat(p); err == nil && (fi.IsDir() || filepath.Base(p) == "daemon.lock") {
				out = append(out, p)
			}
		}
		return strings.Join(out, " ")
	}
	testutil.WaitFor(t, func() bool {
		entries, _ := os.ReadDir(filepath.Join(d.RunDir, "netfiles"))
		return len(entries) == 0
	})
	before := skeleton()
	if !strings.Contains(before, "/runc/sandboxes") || !strings.Contains(before, "daemon.lock") {
		t.Fatalf("run dir of a running daemon: %v", before)
	}
	out, err := exec.Command(d.Bin, "server", "--state-dir", d.StateDir, "--socket", filepath.Join(d.Base, "second.sock"),
		"--cgroup-parent", d.Cgroup).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another corral daemon uses") {
		t.Fatalf("second daemon on the same state dir: %v\n%s", err, out)
	}
	if after := skeleton(); after != before {
		t.Fatalf("run dir changed by the second daemon:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := os.Stat(cgroup); err != nil {
		t.Fatalf("cgroup parent after the second daemon: %v", err)
	}
	d.execOut(t, d.create(t, corral.CreateOptions{}).ID, "true")
}

// TestRestartKeepsSandboxes: a sandbox created before a clean restart is
// usable after it, with its files.
func TestRestartKeepsSandboxes(t *testing.T) {
	d := startDaemon(t, "btrfs")
	sb := d.create(t, corral.CreateOptions{})
	d.execOut(t, sb.ID, "echo persisted > /root/note")
	d.Stop()
	d.Start()
	out, _ := d.execOut(t, sb.ID, "cat /root/note")
	if out != "persisted\n" {
		t.Fatalf("after restart: %q", out)
	}
}

// TestTCPNeedsKey: the TCP listener refuses requests without the key, and
// the daemon refuses to listen on TCP without one.
func TestTCPNeedsKey(t *testing.T) {
	addr := testutil.FreeLoopbackAddr(t)
	d := startDaemon(t, "overlay", "--listen", addr, "--api-key", "secret")
	for _, tt := range []struct {
		name, header, value string
		want                int
	}{
		{"no key", "", "", 401},
		{"wrong key", "Authorization", "Bearer nope", 401},
		{"bearer", "Authorization", "Bearer secret", 200},
		{"lower-case bearer", "Authorization", "bearer secret", 200},
		{"wrong key, lower-case bearer", "Authorization", "bearer nope", 401},
		{"x-api-key", "X-API-Key", "secret", 200},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", "http://"+addr+"/v1/sandboxes", nil)
			if tt.header != "" {
				req.Header.Set(tt.header, tt.value)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, b)
			}
			if tt.want == 401 && !strings.Contains(string(b), `"unauthenticated"`) {
				t.Fatalf("401 body: %s", b)
			}
		})
	}
	// The SDK and CLI use CORRAL_API_KEY.
	c, err := corral.New("http://"+addr, "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.List(t.Context(), corral.ListOptions{}); err != nil {
		t.Fatalf("SDK with key: %v", err)
	}

	cmd := exec.Command(d.Bin, "server", "--state-dir", t.TempDir(), "--socket", filepath.Join(t.TempDir(), "s.sock"), "--listen", "127.0.0.1:0")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "API key") {
		t.Fatalf("server with --listen and no key: err %v, output %s", err, out)
	}
}

// TestFullBinaryAsAgent: with --agent naming the corral binary itself, as
// when no usable corral-agent lies next to it, sandboxes run `corral
// agent` and work the same, on runc and on gVisor.
func TestFullBinaryAsAgent(t *testing.T) {
	extra := []string{"--agent", testutil.CorralBinary(t)}
	runtimes := []string{"runc"}
	if _, err := exec.LookPath("runsc"); err == nil {
		extra = append(extra, "--runtimes", "gvisor")
		runtimes = append(runtimes, "gvisor")
	}
	d := startDaemon(t, "overlay", extra...)
	full, err := os.Stat(d.Bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range runtimes {
		sb := d.create(t, corral.CreateOptions{Runtime: rt})
		out, res := d.execOut(t, sb.ID, "stat -c %s /.corral/agent; exit 3")
		if res.ExitCode != 3 || out != fmt.Sprintf("%d\n", full.Size()) {
			t.Errorf("%s: exit %d, output %q; want the full binary's size %d and exit 3", rt, res.ExitCode, out, full.Size())
		}
	}
}
