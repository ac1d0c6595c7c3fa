package hostile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/testutil"
	corral "github.com/corralrun/corral/sdk"
)

// latencyBudget is the neighbour's exec round trip p99 that a fork bomb or
// a CPU spin next door must not push it past.
const latencyBudget = 50 * time.Millisecond

// TestHostile runs every case against one daemon, one after the other (a
// case that measures latency must not share the machine with another
// attack), with one neighbour sandbox that each case checks.
func TestHostile(t *testing.T) {
	d := startDaemon(t)
	runCases(t, &suite{d: d, attack: buildAttack(t), runtime: "runc"})
}

// TestHostileGVisor runs the same cases with gVisor sandboxes. Where
// gVisor contains an attack differently, the case says so and checks
// gVisor's way.
func TestHostileGVisor(t *testing.T) {
	testutil.RequiresBinary(t, "runsc")
	d := startDaemon(t, "--runtimes", "gvisor")
	runCases(t, &suite{d: d, attack: buildAttack(t), runtime: "gvisor"})
}

func runCases(t *testing.T, s *suite) {
	d := s.d
	nb, err := d.Client.Create(t.Context(), corral.CreateOptions{Template: "bb", Runtime: s.runtime, CPUs: 1, MemoryMB: 128})
	if err != nil {
		t.Fatal(err)
	}
	s.neighbour = nb.ID
	if _, err := d.Client.WriteFile(t.Context(), nb.ID, "/attack", bytes.NewReader(s.attack), 0o755); err != nil {
		t.Fatal(err)
	}
	idle := s.neighbourLatency(t, 50)
	t.Logf("neighbour exec round trip at rest: p50 %v p99 %v", idle[len(idle)/2], p99(idle))

	cases := []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"confinement", testConfinement},
		{"syscalls", testSyscalls},
		{"host-files-env-sockets", testHostFiles},
		{"file-api-escapes", testFileAPIEscapes},
		{"mount-escapes", testMountEscapes},
		{"fork-bomb", testForkBomb},
		{"memory-bomb", testMemoryBomb},
		{"disk-fill", testDiskFill},
		{"cpu-spin", testCPUSpin},
		{"unbounded-output", testUnboundedOutput},
		{"timeouts", testTimeouts},
		{"per-user-limits", testPerUserLimits},
		{"neighbour-files", testNeighbourFiles},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.hostState(t)
			c.run(t, s)
			s.checkNeighbour(t)
			s.checkHost(t, before)
		})
	}
}

// testConfinement checks the sandbox's own view of its confinement, and
// that its processes are not root on the host.
func testConfinement(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{})
	res := s.sh(t, id, "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status; cat /proc/self/uid_map; ulimit -n; ulimit -c", 10*time.Second)
	want := []string{"CapInh:\t0000000000000000", "CapPrm:\t00000000000004fb", "CapEff:\t00000000000004fb",
		"CapBnd:\t00000000000004fb", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"}
	if s.runtime == "gvisor" {
		// gVisor's /proc/self/status has no CapAmb and no NoNewPrivs line.
		want = slices.DeleteFunc(want, func(w string) bool {
			return strings.HasPrefix(w, "CapAmb") || strings.HasPrefix(w, "NoNewPrivs")
		})
	}
	for _, w := range want {
		if !strings.Contains(res.stdout, w+"\n") {
			t.Errorf("sandbox status lacks %q:\n%s", w, res.stdout)
		}
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if n := len(lines); n < 3 || lines[n-2] != "4096" || lines[n-1] != "0" {
		t.Errorf("open files and core limits: %q, want 4096 and 0", lines)
	}
	// uid_map: "0 <host> 65536": root inside is an unprivileged host user.
	// gVisor shows its own kernel's map there; its mapping applies to the
	// host processes below, checked by their uids.
	mapLines := lines
	if s.runtime == "gvisor" {
		mapLines = nil
	}
	for _, l := range mapLines {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "0" {
			host, _ := strconv.ParseUint(f[1], 10, 32)
			if host < 1<<31 || f[2] != "65536" {
				t.Errorf("uid_map %q: want 65536 IDs from 2^31 up", l)
			}
		}
	}
	uids := s.sandboxUIDs(t, id)
	if len(uids) == 0 {
		t.Fatal("no processes found in the sandbox's cgroup")
	}
	for _, u := range uids {
		if u < 1<<31 {
			t.Errorf("a sandbox process runs as host uid %d", u)
		}
	}
	t.Logf("sandbox processes run as host uids %v", uids)
}

// wantProbes is what each probe of `attack probes` must get inside a
// sandbox ("fails": any error); a missing probe line fails too.
var wantProbes = map[string]string{
	"ptrace-daemon": "EPERM", "ptrace-init": "EPERM", "ptrace-child": "EPERM", "process_vm_readv": "EPERM",
	"unshare-user": "EPERM", "unshare-mount": "EPERM", "unshare-net": "EPERM", "clone-newuser": "EPERM",
	"clone3": "ENOSYS", "setns": "EPERM",
	"mount": "EPERM", "umount2": "EPERM", "fsopen": "EPERM", "pivot_root": "EPERM",
	"finit_module": "EPERM", "init_module": "EPERM", "delete_module": "EPERM", "kexec_file_load": "EPERM",
	"keyctl": "EPERM", "add_key": "EPERM", "bpf": "EPERM", "perf_event_open": "EPERM", "userfaultfd": "EPERM",
	"io_uring_setup": "EPERM", "name_to_handle_at": "EPERM", "open_by_handle_at": "EPERM",
	"socket-packet": "EPERM", "socket-raw-icmp": "EPERM", "mknod": "EPERM",
	"tiocsti": "EPERM", "btrfs-subvol-create": "EPERM",
	"personality": "EPERM", "personality-query": "ok", "adjtimex": "EPERM", "syslog": "EPERM", "iopl": "EPERM",
	"swapoff": "EPERM", "reboot": "EPERM",
	"write-proc-sys-hostname": "EROFS", "write-sysrq-trigger": "fails", "lower-oom-score": "EACCES",
	"sethostname": "EPERM", "chroot": "EPERM",
	// getpid through the i386 (int 0x80) and x32 ABIs: the filter covers
	// the native ABI only and kills the process that uses another.
	"i386-abi": "killed", "x32-abi": "killed",
}

// gvisorProbes is wantProbes where gVisor answers differently, each for a
// reason that keeps the host out of reach.
func gvisorProbes() map[string]string {
	m := maps.Clone(wantProbes)
	// gVisor's own answers: no persona query, an I/O error for the
	// read-only file.
	m["personality-query"] = "EINVAL"
	m["write-proc-sys-hostname"] = "fails"
	// The score is gVisor's own: the host's OOM killer sees the Sentry's
	// (500), which nothing inside can reach.
	m["lower-oom-score"] = "ok"
	return m
}

// testSyscalls runs every system-call probe; each must fail the way the
// seccomp profile, the capability set or the read-only /proc paths make it
// fail. TestProbesWithoutConfinement shows the same probes get through
// without them.
func testSyscalls(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{})
	res := s.sh(t, id, fmt.Sprintf("/attack probes %d", s.d.Cmd().Process.Pid), 30*time.Second)
	if res.ExitCode != 0 {
		t.Fatalf("attack probes: exit %d, stderr %s", res.ExitCode, res.stderr)
	}
	got := probes(res.stdout)
	expected := wantProbes
	if s.runtime == "gvisor" {
		expected = gvisorProbes()
	}
	lacks := hostLacks(t, s.attack)
	for _, probe := range slices.Sorted(maps.Keys(lacks)) {
		t.Logf("%s: %s: its outcome here shows no confinement, only that it fails", probe, lacks[probe])
	}
	expected = forHost(expected, lacks)
	for probe, want := range expected {
		if g := got[probe]; !matches(want, g) {
			t.Errorf("%s: got %q, want %s", probe, g, want)
		}
	}
	t.Logf("probes:\n%s", res.stdout)
	// The host name the probes tried to change is the sandbox's own.
	if out := s.sh(t, id, "hostname", 5*time.Second).stdout; out != id+"\n" {
		t.Errorf("sandbox host name = %q, want %s", out, id)
	}
}

// testHostFiles looks for the host's secrets from inside: a host file, the
// daemon's environment, its state and run directories and API socket,
// another sandbox's agent socket, and a TCP listener on the host's
// loopback.
func testHostFiles(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{})
	d := s.d
	res := s.sh(t, id, "/attack find "+d.secret+" / "+d.Base+" "+d.StateDir+" "+d.RunDir, 60*time.Second)
	if !strings.Contains(res.stdout, "found total 0\n") || strings.Contains(res.stdout, "found /") {
		t.Errorf("the secret is readable inside:\n%s", res.stdout)
	}
	// Environment of the agent (PID 1), of every process, and of an exec.
	res = s.sh(t, id, "env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'", 10*time.Second)
	if strings.Contains(res.stdout, d.secret) || strings.Contains(res.stdout, "CORRAL_TEST_SECRET") {
		t.Errorf("the daemon's environment is visible inside:\n%s", res.stdout)
	}
	// The agent's descriptors, its log on the host among them, and its
	// environment: the agent is not dumpable.
	res = s.sh(t, id, "echo x >> /proc/1/fd/2 && echo wrote; cat /proc/1/fd/2 >/dev/null && echo opened; cat /proc/1/environ >/dev/null && echo read; true", 10*time.Second)
	if strings.TrimSpace(res.stdout) != "" {
		t.Errorf("the agent's descriptors or environment from inside: %q", res.stdout)
	}
	agentSock := s.agentSocket(s.neighbour)
	res = s.sh(t, id, "/attack connect "+d.Socket+" "+agentSock, 10*time.Second)
	for _, p := range []string{d.Socket, agentSock} {
		if !strings.Contains(res.stdout, "connect "+p+" ENOENT") {
			t.Errorf("connecting to %s from inside: %q, want ENOENT", p, res.stdout)
		}
	}
	res = s.sh(t, id, "ls "+d.StateDir+" "+d.RunDir+" "+d.Base+" 2>&1; cat /proc/1/root"+d.secretFile+" 2>&1; cat /etc/shadow 2>&1", 10*time.Second)
	if strings.Contains(res.stdout, "corral.db") || strings.Contains(res.stdout, "netfiles") || strings.Contains(res.stdout, d.secret) {
		t.Errorf("host files visible inside:\n%s", res.stdout)
	}
	if shadow, err := os.ReadFile("/etc/shadow"); err == nil && len(shadow) > 0 && strings.Contains(res.stdout, string(shadow)) {
		t.Error("the host's /etc/shadow is readable inside")
	}
	// A TCP service on the host's loopback is not the sandbox's loopback.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	res = s.sh(t, id, "/attack tcp "+l.Addr().String(), 10*time.Second)
	if !strings.Contains(res.stdout, "ECONNREFUSED") {
		t.Errorf("connecting to the host's loopback from inside: %q, want ECONNREFUSED", res.stdout)
	}
}

// testFileAPIEscapes tries to leave the sandbox through the file API with
// symlinks made inside and with ".." in paths.
func testFileAPIEscapes(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{})
	d := s.d
	s.sh(t, id, "ln -s / /tmp/root; ln -s "+d.secretFile+" /tmp/secret; ln -s "+d.StateDir+" /tmp/state; ln -s /proc/1/root /tmp/init-root", 5*time.Second)
	own := s.sh(t, id, "cat /etc/passwd", 5*time.Second).stdout
	for _, p := range []string{"/tmp/secret", "/../../../.." + d.secretFile, "/tmp/root/.." + d.secretFile,
		"/tmp/state/corral.db", "/tmp/init-root" + d.secretFile, "/tmp/root/../../proc/1/root" + d.secretFile} {
		b, err := s.readFile(t, id, p)
		if err == nil && strings.Contains(string(b), d.secret) {
			t.Errorf("reading %s through the file API returned the host's secret", p)
		}
		if err == nil {
			t.Errorf("reading %s through the file API succeeded: %q", p, b)
		} else if corral.ErrorCode(err) != corral.CodeNotFound {
			t.Errorf("reading %s: %v, want not_found", p, err)
		}
	}
	for _, p := range []string{"/tmp/root/etc/passwd", "/../etc/passwd", "/tmp/init-root/etc/passwd", "/tmp/root/../etc/passwd"} {
		// The agent cleans ".." before it resolves symlinks, so the
		// last one names /tmp/etc/passwd: not found is right too.
		b, err := s.readFile(t, id, p)
		if err == nil && string(b) != own {
			t.Errorf("reading %s: %q; want the sandbox's own /etc/passwd", p, b)
		}
		if err != nil && (corral.ErrorCode(err) != corral.CodeNotFound || !strings.HasSuffix(p, "/../etc/passwd")) {
			t.Errorf("reading %s: %v", p, err)
		}
	}
	// Writes with ".." and through a symlink to / stay inside.
	name := "corral-hostile-" + randHex(4)
	for _, p := range []string{"/../../../tmp/" + name, "/tmp/root/tmp/" + name + "-2", "/tmp/state/" + name} {
		_, _ = s.d.Client.WriteFile(t.Context(), id, p, strings.NewReader("x"), 0o644)
	}
	for _, p := range []string{"/tmp/" + name, "/tmp/" + name + "-2", filepath.Join(d.StateDir, name)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a write through the file API reached the host at %s (%v)", p, err)
		}
	}
	if out := s.sh(t, id, "cat /tmp/"+name, 5*time.Second).stdout; out != "x" {
		t.Errorf("the write with .. did not land in the sandbox's /tmp: %q", out)
	}
}

// testForkBomb runs a fork bomb under a pids limit while the neighbour's
// exec latency is measured, then shows that the limit is what stopped it.
func testForkBomb(t *testing.T, s *suite) {
	const limit = 128
	if s.runtime == "gvisor" {
		testGVisorForkBomb(t, s, limit)
		return
	}
	id := s.create(t, corral.CreateOptions{Pids: limit, CPUs: 1})
	budget := s.latencyLimit(t, latencyBudget)
	wait := s.background(t, id, "bomb() { bomb | bomb & }; bomb; sleep 8", 6*time.Second)
	time.Sleep(500 * time.Millisecond)
	best, rounds := s.neighbourP99(t, budget)
	st, err := s.d.Client.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	res := wait()
	t.Logf("fork bomb: exit %d timed out %v, pids %d; neighbour exec %v", res.ExitCode, res.TimedOut, st.Pids, rounds)
	if st.Pids > limit {
		t.Errorf("the sandbox has %d tasks, above its limit %d", st.Pids, limit)
	}
	// pids.events counts forks refused by the limit.
	if ev := s.cgroupValue(t, "pids", id, "pids.events", "max"); ev < 1 {
		t.Errorf("pids.events max = %d: the limit never refused a fork", ev)
	} else {
		t.Logf("the pids limit refused %d forks", ev)
	}
	if !strings.Contains(res.stderr, "Resource temporarily unavailable") {
		t.Errorf("the fork bomb's stderr does not say fork failed with EAGAIN:\n%.2000s", res.stderr)
	}
	if best > budget {
		t.Errorf("neighbour exec p99 %v during a fork bomb, want < %v", best, budget)
	}
	// The bomb's process group died with the timeout: the sandbox works.
	waitFor(t, 10*time.Second, func() bool {
		r := s.sh(t, id, "echo ok", 5*time.Second)
		return r.stdout == "ok\n"
	})
	// The limit is what stopped it: 200 processes fail under 128 and
	// start under 1024.
	res = s.sh(t, id, "/attack fork 200", 20*time.Second)
	if !strings.Contains(res.stdout, "fork EAGAIN") {
		t.Errorf("200 forks under a limit of %d: %q, want EAGAIN", limit, res.stdout)
	}
	roomy := s.create(t, corral.CreateOptions{Pids: 1024})
	res = s.sh(t, roomy, "/attack fork 200", 20*time.Second)
	if !strings.Contains(res.stdout, "started 200\nfork ok") {
		t.Errorf("200 forks under a limit of 1024: %q, want all started", res.stdout)
	}
}

// testGVisorForkBomb is testForkBomb on gVisor. gVisor counts the pids
// limit inside its kernel: a fork past it fails with EAGAIN, but clones
// racing each other get past it, and every guest process is a host stub
// process that systrap pools and never frees. A fork bomb thus grows the
// host's count until the host cgroup's backstop (the gvisor driver's
// package documentation), which kills the Sentry: the bomb ends either
// with EAGAIN or with its own sandbox, and either way the neighbour and
// the host are unharmed.
func testGVisorForkBomb(t *testing.T, s *suite, limit int64) {
	id := s.create(t, corral.CreateOptions{Pids: limit, CPUs: 1})
	budget := s.latencyLimit(t, contendedBudget(s.runtime))
	type outcome struct {
		r   result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := s.run(t.Context(), id, corral.ExecOptions{Shell: "bomb() { bomb | bomb & }; bomb; sleep 8", Timeout: 6 * time.Second})
		done <- outcome{r, err}
	}()
	time.Sleep(500 * time.Millisecond)
	best, rounds := s.neighbourP99(t, budget)
	o := <-done
	hostTasks := s.cgroupValue(t, "pids", id, "pids.max", "")
	if o.err != nil {
		t.Logf("fork bomb: the sandbox ended (%v), refused by the host limit of %d tasks %d times; neighbour exec %v",
			o.err, hostTasks, s.cgroupValue(t, "pids", id, "pids.events", "max"), rounds)
		s.waitError(t, id)
	} else {
		t.Logf("fork bomb: exit %d timed out %v; neighbour exec %v", o.r.ExitCode, o.r.TimedOut, rounds)
		if !strings.Contains(o.r.stderr, "Resource temporarily unavailable") {
			t.Errorf("the fork bomb's stderr does not say fork failed with EAGAIN:\n%.2000s", o.r.stderr)
		}
	}
	if best > budget {
		t.Errorf("neighbour exec p99 %v during a fork bomb, want < %v", best, budget)
	}
	// The limit stops forks one after the other: 200 processes fail under
	// 128 and start under 1024.
	id = s.create(t, corral.CreateOptions{Pids: limit})
	if res := s.sh(t, id, "/attack fork 200", 20*time.Second); !strings.Contains(res.stdout, "fork EAGAIN") {
		t.Errorf("200 forks under a limit of %d: %q, want EAGAIN", limit, res.stdout)
	}
	roomy := s.create(t, corral.CreateOptions{Pids: 1024})
	if res := s.sh(t, roomy, "/attack fork 200", 20*time.Second); !strings.Contains(res.stdout, "started 200\nfork ok") {
		t.Errorf("200 forks under a limit of 1024: %q, want all started", res.stdout)
	}
}

// testMemoryBomb allocates past the memory limit: the process is OOM
// killed, the exit event says so, and the same allocation fits a larger
// limit.
func testMemoryBomb(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{MemoryMB: 64})
	if s.runtime == "gvisor" {
		testGVisorMemoryBomb(t, s, id)
		return
	}
	res := s.sh(t, id, "/attack alloc 256", 30*time.Second)
	if !res.OOMKilled || res.Signal != "SIGKILL" {
		t.Errorf("allocating 256 MiB under 64 MiB: %+v, stdout %q; want oom_killed", res.ExecResult, res.stdout)
	}
	st, err := s.d.Client.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 || st.MemoryBytes > 64<<20 {
		t.Errorf("stats after the OOM kill: %+v", st)
	}
	// Memory plus swap never went past the limit: no swapping either.
	// The kernel charges in per-CPU batches of pages, so the peak may
	// pass the limit by a few pages.
	for _, f := range []string{"memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"} {
		if v := s.cgroupValue(t, "memory", id, f, ""); v > 65<<20 {
			t.Errorf("%s = %d, above the 64 MiB limit", f, v)
		}
	}
	if r := s.sh(t, id, "echo ok", 5*time.Second); r.stdout != "ok\n" {
		t.Errorf("sandbox after its OOM kill: %q", r.stdout)
	}
	roomy := s.create(t, corral.CreateOptions{MemoryMB: 512})
	if r := s.sh(t, roomy, "/attack alloc 256", 30*time.Second); !strings.Contains(r.stdout, "alloc ok 256") {
		t.Errorf("allocating 256 MiB under 512 MiB: %+v %q", r.ExecResult, r.stdout)
	}
}

// testGVisorMemoryBomb is testMemoryBomb on gVisor, which has no
// out-of-memory killer of its own: the host's kills the Sentry, so the
// whole sandbox ends, in error, with the kill in its stats, and the host
// cgroup never went past the limit plus the driver's overhead.
func testGVisorMemoryBomb(t *testing.T, s *suite, id string) {
	res, err := s.run(t.Context(), id, corral.ExecOptions{Shell: "/attack alloc 256", Timeout: 30 * time.Second})
	if err == nil && !res.OOMKilled {
		t.Errorf("allocating 256 MiB under 64 MiB: %+v, stdout %q; want the sandbox killed", res.ExecResult, res.stdout)
	}
	t.Logf("allocating 256 MiB under 64 MiB: %v", err)
	st, err := s.d.Client.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 {
		t.Errorf("stats after the OOM kill: %+v", st)
	}
	for _, f := range []string{"memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"} {
		if v := s.cgroupValue(t, "memory", id, f, ""); v > (64+65)<<20 {
			t.Errorf("%s = %d, above the 64 MiB limit and 64 MiB of overhead", f, v)
		}
	}
	s.waitError(t, id)
	roomy := s.create(t, corral.CreateOptions{MemoryMB: 512})
	if r := s.sh(t, roomy, "/attack alloc 256", 30*time.Second); !strings.Contains(r.stdout, "alloc ok 256") {
		t.Errorf("allocating 256 MiB under 512 MiB: %+v %q", r.ExecResult, r.stdout)
	}
}

// waitError waits until sandbox id, whose instance died, is in the error
// state. The daemon looks at an instance when an exec through its agent
// fails, so each round tries one: the first failure may come while the
// Sentry is still exiting.
func (s *suite) waitError(t *testing.T, id string) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool {
		_, _ = s.run(t.Context(), id, corral.ExecOptions{Cmd: []string{"true"}, Timeout: time.Second})
		sb, err := s.d.Client.Get(t.Context(), id)
		return err == nil && sb.State == "error"
	})
}

// testDiskFill writes past a 100 MiB disk quota: the write fails with
// EDQUOT, the host's file system gains no more than the quota, and the
// same write succeeds without a quota.
func testDiskFill(t *testing.T, s *suite) {
	img := filepath.Join(s.d.StateDir, "storage", "btrfs.img")
	before := allocated(t, img)
	id := s.create(t, corral.CreateOptions{DiskMB: 100})
	res := s.sh(t, id, "dd if=/dev/zero of=/fill bs=1M count=200; sync; stat -c %s /fill", 60*time.Second)
	if res.ExitCode == 0 && !strings.Contains(res.stderr, "quota") {
		t.Errorf("writing 200 MiB under a 100 MiB quota: exit %d, stderr %q", res.ExitCode, res.stderr)
	}
	if !strings.Contains(res.stderr, "Disk quota exceeded") && !strings.Contains(res.stderr, "No space left") {
		t.Errorf("the write did not fail with EDQUOT or ENOSPC: %q", res.stderr)
	}
	if size, _ := strconv.ParseInt(strings.TrimSpace(res.stdout), 10, 64); size > 101<<20 {
		t.Errorf("the sandbox wrote %d bytes under a 100 MiB quota", size)
	}
	// The data lands in the sandbox's root inside the storage image
	// and nowhere else: the image grows by at most the quota.
	if grew := allocated(t, img) - before; grew > 130<<20 {
		t.Errorf("the storage image grew by %d MiB for a 100 MiB quota", grew>>20)
	}
	t.Logf("disk fill: %s", strings.TrimSpace(res.stderr))
	// Freeing space frees quota.
	if r := s.sh(t, id, "rm /fill && dd if=/dev/zero of=/again bs=1M count=10 2>&1 && echo ok", 30*time.Second); !strings.Contains(r.stdout, "ok") {
		t.Errorf("writing after freeing the quota: %q", r.stdout)
	}
	roomy := s.create(t, corral.CreateOptions{})
	if r := s.sh(t, roomy, "dd if=/dev/zero of=/fill bs=1M count=150 2>&1 && rm /fill && echo ok", 60*time.Second); !strings.Contains(r.stdout, "ok") {
		t.Errorf("writing 150 MiB without a quota: %q", r.stdout)
	}
}

// allocated returns the bytes a file occupies on disk.
func allocated(t *testing.T, name string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(name, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// testCPUSpin spins on every core in a sandbox limited to one CPU while
// the neighbour's exec latency is measured; the spinner gets no more than
// its quota, and the quota is what held it back: the kernel throttled it,
// and does not throttle the same spin under a quota above the machine's
// cores.
func testCPUSpin(t *testing.T, s *suite) {
	const spin = "for i in 1 2 3 4 5 6 7 8; do (while :; do :; done) & done; sleep 60"
	id := s.create(t, corral.CreateOptions{CPUs: 1})
	budget := s.latencyLimit(t, contendedBudget(s.runtime))
	throttled := s.cgroupValue(t, "cpu", id, "cpu.stat", "nr_throttled")
	wait := s.background(t, id, spin, 5*time.Second)
	time.Sleep(500 * time.Millisecond)
	before, err := s.d.Client.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	best, rounds := s.neighbourP99(t, budget)
	time.Sleep(time.Until(t0.Add(2 * time.Second)))
	after, err := s.d.Client.Stats(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(t0)
	res := wait()
	throttled = s.cgroupValue(t, "cpu", id, "cpu.stat", "nr_throttled") - throttled
	cores := float64(after.CPUUsageNanos-before.CPUUsageNanos) / float64(elapsed.Nanoseconds())
	t.Logf("cpu spin: %.2f cores used under a 1-core quota, throttled in %d periods; neighbour exec %v; exit %+v",
		cores, throttled, rounds, res.ExecResult)
	if cores > 1.15 {
		t.Errorf("the spinner used %.2f cores under a 1-core quota", cores)
	}
	if throttled < 1 {
		t.Errorf("the kernel never throttled a spinner on every core under a 1-core quota")
	}
	if best > budget {
		t.Errorf("neighbour exec p99 %v during a CPU spin, want < %v", best, budget)
	}
	if !res.TimedOut {
		t.Errorf("the spinner was not stopped by its timeout: %+v", res.ExecResult)
	}
	// With a quota above the machine's cores the same spin is never
	// throttled.
	roomy := s.create(t, corral.CreateOptions{CPUs: float64(runtime.NumCPU() + 1)})
	r := s.sh(t, roomy, spin, 1500*time.Millisecond)
	if n := s.cgroupValue(t, "cpu", roomy, "cpu.stat", "nr_throttled"); n != 0 || !r.TimedOut {
		t.Errorf("spinning under a quota of %d cores: throttled in %d periods, %+v; want 0", runtime.NumCPU()+1, n, r.ExecResult)
	}
}

// contendedBudget is the neighbour's p99 that an attacker using all of
// its CPU quota next door (a spin, or gVisor's fork bomb, whose Sentry
// spins creating host stubs) may push it to. A gVisor neighbour's exec
// is a round trip through its own user-space kernel, whose threads
// compete with the attacker for the one core the attacker's quota leaves
// on a two-core machine; its tail under that contention is twice a runc
// neighbour's, while its median stays within a few milliseconds of rest
// (the log shows both).
func contendedBudget(runtime string) time.Duration {
	if runtime == "gvisor" {
		return 2 * latencyBudget
	}
	return latencyBudget
}

// testUnboundedOutput streams output as fast as the sandbox can write it,
// to a fast reader and to a reader that stalls; the daemon's memory stays
// bounded.
func testUnboundedOutput(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{})
	base := s.daemonRSS()
	var peak int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				peak = max(peak, s.daemonRSS())
			}
		}
	}()
	out := &limitedBuffer{max: 1 << 10}
	res, err := s.d.Client.Exec(t.Context(), id, corral.ExecOptions{Cmd: []string{"yes", "hostile output line"}, Timeout: 3 * time.Second, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	slow := &stallingWriter{stall: 2 * time.Second}
	res2, err := s.d.Client.Exec(t.Context(), id, corral.ExecOptions{Cmd: []string{"yes", "hostile output line"}, Timeout: 3 * time.Second, Stdout: slow})
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-sampled
	t.Logf("unbounded output: %d MiB streamed to a fast reader, %d MiB to a stalling one; daemon RSS %d MiB at rest, peak %d MiB",
		out.total>>20, slow.total>>20, base>>20, peak>>20)
	if !res.TimedOut || !res2.TimedOut {
		t.Errorf("the writers were not stopped by their timeouts: %+v %+v", res, res2)
	}
	if out.total < 10<<20 {
		t.Errorf("only %d bytes streamed in 3 s", out.total)
	}
	if peak-base > 64<<20 {
		t.Errorf("the daemon grew by %d MiB while streaming output", (peak-base)>>20)
	}

	// With a cap, the client gets exactly the cap and a marker, and the
	// writer is drained (not blocked) until it ends.
	var capped, marker limitedBuffer
	marker.max = 1 << 10
	capped.max = 1 << 10
	res3, err := s.d.Client.Exec(t.Context(), id, corral.ExecOptions{Shell: "yes hostile | head -c 20000000", MaxOutputBytes: 1 << 20,
		Stdout: &capped, Stderr: &marker})
	if err != nil {
		t.Fatal(err)
	}
	if capped.total != 1<<20 || !res3.OutputTruncated || res3.OutputDiscarded != 20000000-(1<<20) || res3.ExitCode != 0 {
		t.Errorf("capped output: %d bytes, result %+v", capped.total, res3)
	}
	if !strings.Contains(marker.b.String(), "output truncated at 1048576 bytes") {
		t.Errorf("no truncation marker on stderr: %q", marker.b.String())
	}
}

// stallingWriter blocks on its first write for stall, then takes
// everything.
type stallingWriter struct {
	stall   time.Duration
	stalled bool
	total   int64
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	if !w.stalled {
		w.stalled = true
		time.Sleep(w.stall)
	}
	w.total += int64(len(p))
	return len(p), nil
}

// testTimeouts checks the per-exec timeout and the sandbox deadline.
func testTimeouts(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{})
	t0 := time.Now()
	res := s.sh(t, id, "sleep 30", 300*time.Millisecond)
	if !res.TimedOut || time.Since(t0) > 5*time.Second {
		t.Errorf("sleep 30 with a 300 ms timeout: %+v after %v", res.ExecResult, time.Since(t0))
	}
	if r := s.sh(t, id, "sleep 0.2; echo done", 0); r.TimedOut || r.stdout != "done\n" {
		t.Errorf("without a timeout: %+v %q", r.ExecResult, r.stdout)
	}
	sb, err := s.d.Client.Create(t.Context(), corral.CreateOptions{Template: "bb", Timeout: corral.Timeout(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, func() bool {
		_, err := s.d.Client.Get(t.Context(), sb.ID)
		return corral.ErrorCode(err) == corral.CodeNotFound
	})
}

// testPerUserLimits exhausts a per-user kernel limit (inotify instances,
// 128 per user by default) inside a sandbox. With a user namespace the
// sandbox's root is a user of its own, so neither the host's root nor
// another sandbox runs out.
func testPerUserLimits(t *testing.T, s *suite) {
	id := s.create(t, corral.CreateOptions{})
	wait := s.background(t, id, "/attack inotify 100000", 20*time.Second)
	time.Sleep(time.Second)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("host root cannot create an inotify instance while a sandbox holds its maximum: %v", err)
	} else {
		unix.Close(fd)
	}
	if r := s.sh(t, s.neighbour, "/attack inotify 8", 20*time.Second); !strings.Contains(r.stdout, "inotify instances 8") {
		t.Errorf("the neighbour cannot create inotify instances: %q", r.stdout)
	}
	res := wait()
	if !strings.Contains(res.stdout, "inotify EMFILE") {
		t.Errorf("the sandbox was not stopped by its own per-user limit: %q", res.stdout)
	}
	t.Logf("per-user limits: %s", strings.TrimSpace(res.stdout))
}

// waitFor polls cond until it holds or fails the test after limit.
func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("condition not met within %v", limit)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
