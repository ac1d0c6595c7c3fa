package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// rssSampler records the largest VmRSS of a process while it runs.
type rssSampler struct {
	pid  int
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	max  int64
	err  error
}

// vmRSS reads a process's resident set size in bytes.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS line")
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{pid: pid, stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			v, err := vmRSS(pid)
			s.mu.Lock()
			if err != nil && s.err == nil {
				s.err = err
			}
			s.max = max(s.max, v)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// done stops sampling and returns the peak.
func (s *rssSampler) done() (int64, error) {
	close(s.stop)
	s.wg.Wait()
	return s.max, s.err
}

// patternReader yields n pseudo-random bytes from a fixed seed without
// holding them, so that a large file costs no memory in the test.
func patternReader(n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{'c', 'o', 'r', 'r', 'a', 'l'}), n)
}

func sum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// TestLargeFileStreams moves 1 GiB into a sandbox and back out (as a file
// and as a tar) with equal checksums, while the daemon's resident memory
// grows by less than 64 MiB: nothing is buffered whole on the way.
func TestLargeFileStreams(t *testing.T) {
	const size = 1 << 30
	d := startDaemon(t, e2eStorage)
	sb := d.create(t, corral.CreateOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	pid := d.Cmd().Process.Pid
	base, err := vmRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	rss := sampleRSS(pid)
	start := time.Now()

	up := sha256.New()
	fi, err := d.Client.WriteFile(ctx, sb.ID, "/big/data.bin", io.TeeReader(patternReader(size), up), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != size {
		t.Fatalf("uploaded size %d", fi.Size)
	}
	uploaded := time.Since(start)

	r, err := d.Client.ReadFile(ctx, sb.ID, "/big/data.bin")
	if err != nil {
		t.Fatal(err)
	}
	down := sha256.New()
	n, err := io.Copy(down, r)
	r.Close()
	if err != nil || n != size {
		t.Fatalf("downloaded %d bytes: %v", n, err)
	}
	downloaded := time.Since(start) - uploaded

	tr, err := d.Client.Download(ctx, sb.ID, "/big")
	if err != nil {
		t.Fatal(err)
	}
	viaTar := sha256.New()
	rd := tar.NewReader(tr)
	hdr, err := rd.Next()
	if err != nil || hdr.Name != "data.bin" || hdr.Size != size {
		t.Fatalf("tar entry %+v: %v", hdr, err)
	}
	if _, err := io.Copy(viaTar, rd); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the only entry: %v", err)
	}
	tr.Close()
	archived := time.Since(start) - uploaded - downloaded

	peak, err := rss.done()
	if err != nil {
		t.Fatal(err)
	}
	if sum(up) != sum(down) || sum(up) != sum(viaTar) {
		t.Fatalf("checksums differ: up %s, down %s, tar %s", sum(up), sum(down), sum(viaTar))
	}
	growth := peak - base
	t.Logf("1 GiB: upload %s, download %s, tar download %s; daemon RSS %d MiB -> peak %d MiB",
		uploaded.Round(time.Millisecond), downloaded.Round(time.Millisecond), archived.Round(time.Millisecond), base>>20, peak>>20)
	if growth >= 64<<20 {
		t.Fatalf("daemon RSS grew by %d MiB (from %d MiB); want < 64 MiB", growth>>20, base>>20)
	}
}

// TestFileAPIEscapes tries to leave the sandbox through the file API and
// tar uploads: `..`, absolute host paths, and symbolic links made inside
// the sandbox that point at the host's /etc, at a host sentinel file and at
// the daemon's state. Every attempt fails or stays inside the sandbox, and
// nothing on the host changes.
func TestFileAPIEscapes(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	sb := d.create(t, corral.CreateOptions{})
	ctx := t.Context()
	c := d.Client

	hostDir := t.TempDir()
	sentinel := filepath.Join(hostDir, "sentinel")
	if err := os.WriteFile(sentinel, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	marker := "corral-escape-" + randHex(4)

	// Links made by the sandbox's own processes.
	d.execOut(t, sb.ID, strings.Join([]string{
		"ln -s /etc /etclink",
		"ln -s " + hostDir + " /hostdir",
		"ln -s " + sentinel + " /sentinel",
		"ln -s ../../../../../../../../../.. /up",
		"ln -s " + d.StateDir + " /state",
	}, " && "))

	writes := []string{
		"/../../../../../../.." + sentinel,
		"/../../../../../../../etc/" + marker,
		"/etclink/" + marker,
		"/sentinel",
		"/hostdir/sentinel",
		"/up" + sentinel,
		"/up/etc/" + marker,
		"/state/" + marker,
	}
	for _, p := range writes {
		_, err := c.WriteFile(ctx, sb.ID, p, strings.NewReader("escaped "+marker), 0o644)
		t.Logf("write %s: %v", p, err)
	}
	for _, p := range []string{"/sentinel", "/hostdir/sentinel", "/up" + sentinel, "/../../../../.." + sentinel} {
		r, err := c.ReadFile(ctx, sb.ID, p)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(r)
		r.Close()
		if strings.Contains(string(b), "host secret") {
			t.Errorf("reading %s returned the host's sentinel", p)
		}
	}
	// Tar uploads: escaping entries are refused.
	tarTests := []struct {
		name    string
		entries []*tar.Header
	}{
		{"dot dot", []*tar.Header{{Name: "../../../../../../.." + sentinel, Typeflag: tar.TypeReg, Mode: 0o644}}},
		{"absolute", []*tar.Header{{Name: sentinel, Typeflag: tar.TypeReg, Mode: 0o644}}},
		{"symlink to host dir then through it", []*tar.Header{
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: hostDir},
			{Name: "l/sentinel", Typeflag: tar.TypeReg, Mode: 0o644},
		}},
		{"symlink to /etc then through it", []*tar.Header{
			{Name: "e", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "e/" + marker, Typeflag: tar.TypeReg, Mode: 0o644},
		}},
		{"through the sandbox's own link", []*tar.Header{{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644}}},
	}
	for _, tt := range tarTests {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range tt.entries {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		tw.Close()
		dir := "/target-" + randHex(2)
		if tt.name == "through the sandbox's own link" {
			dir = "/hostdir"
		}
		err := c.Upload(ctx, sb.ID, dir, &buf)
		t.Logf("tar %s into %s: %v", tt.name, dir, err)
		if tt.name != "through the sandbox's own link" && corral.ErrorCode(err) != corral.CodeInvalidArgument {
			t.Errorf("tar %s: %v; want invalid_argument", tt.name, err)
		}
	}

	// The host is untouched.
	after, err := os.Stat(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(sentinel); string(b) != "host secret" || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("host sentinel changed: %q", b)
	}
	if entries, _ := os.ReadDir(hostDir); len(entries) != 1 {
		t.Fatalf("host dir has %d entries, want only the sentinel", len(entries))
	}
	for _, p := range []string{"/etc/" + marker, filepath.Join(d.StateDir, marker)} {
		if _, err := os.Lstat(p); err == nil {
			t.Fatalf("%s was created on the host", p)
		}
	}
	// What was written through the sandbox's own links stayed in it.
	out, _ := d.execOut(t, sb.ID, "cat /etc/"+marker)
	if !strings.Contains(out, "escaped "+marker) {
		t.Errorf("a write through /etclink did not land in the sandbox's /etc: %q", out)
	}

	// A download of a tree whose link points at a host directory copies
	// the link, and nothing is written through it.
	d.execOut(t, sb.ID, "mkdir -p /tree && ln -s "+hostDir+" /tree/evil && echo hi > /tree/ok")
	local := filepath.Join(t.TempDir(), "down")
	if err := c.DownloadDir(ctx, sb.ID, "/tree", local); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(local, "evil")); err != nil || target != hostDir {
		t.Fatalf("evil link: %q %v", target, err)
	}
	if entries, _ := os.ReadDir(hostDir); len(entries) != 1 {
		t.Fatalf("host dir has %d entries after download", len(entries))
	}
}

// TestFileAPIUnreadableFile downloads a file of a runc sandbox that can
// never be read (/proc/self/mem fails at offset 0): the answer is a
// permanent error that a client must not retry, not 503 unavailable, and
// the sandbox's agent goes on serving.
func TestFileAPIUnreadableFile(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	sb := d.create(t, corral.CreateOptions{})
	ctx := t.Context()
	r, err := d.Client.ReadFile(ctx, sb.ID, "/proc/self/mem")
	if err == nil {
		r.Close()
		t.Fatal("reading /proc/self/mem succeeded")
	}
	var e *corral.Error
	if !errors.As(err, &e) || e.Code != corral.CodeFailedPrecondition || e.Status == http.StatusServiceUnavailable ||
		e.RetryAfter != 0 || !strings.Contains(e.Message, "reading /proc/self/mem: input/output error") {
		t.Fatalf("reading /proc/self/mem: %#v, want failed_precondition saying input/output error, without Retry-After", err)
	}
	r, err = d.Client.ReadFile(ctx, sb.ID, "/proc/self/status")
	if err != nil {
		t.Fatalf("reading after the refusal: %v", err)
	}
	defer r.Close()
	if b, err := io.ReadAll(r); err != nil || !bytes.Contains(b, []byte("Name:")) {
		t.Fatalf("reading after the refusal: %q, %v", b, err)
	}
}

// TestFileAPIModeBits writes files with setuid, setgid and sticky bits
// into a runc sandbox (whose agent has no CAP_FSETID over the host, so
// the kernel clears those bits on its writes) both ways, with a plain
// write and a tar upload, new and replaced: each file gets the mode asked
// for, as the API reports it and as the sandbox's own stat sees it.
func TestFileAPIModeBits(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	sb := d.create(t, corral.CreateOptions{})
	ctx := t.Context()
	c := d.Client
	modes := []struct {
		name string
		bits uint32
		mode fs.FileMode
	}{
		{"plain", 0o644, 0o644},
		{"setuid", 0o4755, 0o755 | fs.ModeSetuid},
		{"setgid", 0o2755, 0o755 | fs.ModeSetgid},
		{"both", 0o6750, 0o750 | fs.ModeSetuid | fs.ModeSetgid},
		{"sticky", 0o1777, 0o777 | fs.ModeSticky},
	}
	for _, m := range modes {
		var archive bytes.Buffer
		tw := tar.NewWriter(&archive)
		if err := tw.WriteHeader(&tar.Header{Name: m.name, Typeflag: tar.TypeReg, Mode: int64(m.bits), Size: 2}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte("x\n"))
		tw.Close()
		for _, round := range []string{"new", "replaced"} {
			if _, err := c.WriteFile(ctx, sb.ID, "/plain/"+m.name, strings.NewReader("x\n"), m.mode); err != nil {
				t.Fatalf("plain write of %s (%s): %v", m.name, round, err)
			}
			if err := c.Upload(ctx, sb.ID, "/tar", bytes.NewReader(archive.Bytes())); err != nil {
				t.Fatalf("tar upload of %s (%s): %v", m.name, round, err)
			}
			for _, p := range []string{"/plain/" + m.name, "/tar/" + m.name} {
				info, err := c.Stat(ctx, sb.ID, p)
				if err != nil {
					t.Fatal(err)
				}
				inside, _ := d.execOut(t, sb.ID, "stat -c %a "+p)
				want := strconv.FormatUint(uint64(m.bits), 8)
				if info.Mode != m.bits || strings.TrimSpace(inside) != want {
					t.Errorf("%s (%s): mode %o through the API, %q inside, want %s", p, round, info.Mode, inside, want)
				}
			}
		}
	}
}

// TestCpTree copies a directory tree and single files up and back with
// `corral cp` and compares them, following docker cp's rules.
func TestCpTree(t *testing.T) {
	d := startDaemon(t, e2eStorage)
	sb := d.create(t, corral.CreateOptions{})
	base := t.TempDir()
	src := filepath.Join(base, "tree")
	files := map[string]string{
		"a.txt":            "alpha\n",
		"bin/run.sh":       "#!/bin/sh\necho run\n",
		"deep/er/still.md": strings.Repeat("deep ", 5000),
		"blob.bin":         "\x00\x01\xfe\xff",
	}
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(src, "bin/run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	cp := func(args ...string) {
		t.Helper()
		if _, errOut, code := d.corral(append([]string{"cp"}, args...)...); code != 0 {
			t.Fatalf("corral cp %v: %d %s", args, code, errOut)
		}
	}
	remote := func(p string) string { return sb.ID + ":" + p }

	// A missing destination becomes the directory; an existing one gets it
	// inside; "/." copies only the contents.
	cp(src, remote("/work"))
	cp(src, remote("/work"))
	cp(src+"/.", remote("/flat"))
	out, _ := d.execOut(t, sb.ID, "cat /work/a.txt /work/tree/a.txt /flat/a.txt; /work/tree/bin/run.sh; readlink /work/link; stat -c %a /work/empty")
	if out != "alpha\nalpha\nalpha\nrun\na.txt\n700\n" {
		t.Fatalf("inside the sandbox: %q", out)
	}

	back := filepath.Join(base, "back")
	cp(remote("/work/tree"), back)
	compareTrees(t, src, back)
	cp(remote("/work/tree"), back) // existing: lands in back/tree
	compareTrees(t, src, filepath.Join(back, "tree"))

	// Single files, onto a directory and onto a new name.
	cp(filepath.Join(src, "blob.bin"), remote("/work/"))
	cp(remote("/work/blob.bin"), filepath.Join(base, "blob.copy"))
	if b, err := os.ReadFile(filepath.Join(base, "blob.copy")); err != nil || string(b) != files["blob.bin"] {
		t.Fatalf("blob round trip: %q %v", b, err)
	}
	if _, errOut, code := d.corral("cp", src, remote("/work/a.txt")); code == 0 || !strings.Contains(errOut, "not a directory") {
		t.Fatalf("directory onto a file: %d %s", code, errOut)
	}
	if _, errOut, code := d.corral("cp", remote("/nope"), base); code == 0 || !strings.Contains(errOut, "does not exist") {
		t.Fatalf("missing source: %d %s", code, errOut)
	}
}

// compareTrees fails unless b has the same names, types, permission bits,
// contents and link targets as a.
func compareTrees(t *testing.T, a, b string) {
	t.Helper()
	describe := func(root string) map[string]string {
		out := map[string]string{}
		err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			info, err := de.Info()
			if err != nil {
				return err
			}
			desc := info.Mode().String()
			switch {
			case info.Mode()&fs.ModeSymlink != 0:
				target, _ := os.Readlink(p)
				desc += " -> " + target
			case info.Mode().IsRegular():
				body, _ := os.ReadFile(p)
				h := sha256.Sum256(body)
				desc += " " + hex.EncodeToString(h[:])
			}
			out[rel] = desc
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	da, db := describe(a), describe(b)
	for k, v := range da {
		if k == "." {
			continue
		}
		if db[k] != v {
			t.Errorf("%s: %q, want %q", k, db[k], v)
		}
	}
	for k := range db {
		if _, ok := da[k]; !ok {
			t.Errorf("%s: extra entry", k)
		}
	}
}
