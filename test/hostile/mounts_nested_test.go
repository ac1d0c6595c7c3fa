package hostile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corralrun/corral/sdk"
)

// testMountNestedRename gives one sandbox a directory rw and another a
// directory nested in it: while the second holds its working directory in
// a subdirectory of its mount, the first moves that subdirectory out from
// under the second's mount. Walking ".." from there must not leave the
// second's mount, neither to the first's files nor to the host's (the
// kernel refuses ".." from a directory that is no longer beneath its bind
// mount's root; gVisor walks by the names it knows).
func testMountNestedRename(t *testing.T, s *suite) {
	outer := filepath.Join(s.d.allowed, s.runtime+"-outer")
	inner := filepath.Join(outer, "inner")
	if err := os.MkdirAll(filepath.Join(inner, "held"), 0o755); err != nil {
		t.Fatal(err)
	}
	marker := "outer-only-" + randHex(8)
	if err := os.WriteFile(filepath.Join(outer, "outer-only"), []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{outer, inner, filepath.Join(inner, "held")} {
		if err := os.Chown(d, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	mover := s.create(t, corral.CreateOptions{Mounts: []corral.Mount{{Source: outer, Target: "/w"}}})
	holder := s.create(t, corral.CreateOptions{Mounts: []corral.Mount{{Source: inner, Target: "/n"}}})

	up := strings.Repeat("../", 32)
	script := "cd -P /n/held || exit 1; touch ready; " +
		"i=0; while [ -e /n/held ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; " +
		"[ -e /n/held ] && echo not moved; " +
		"ls -a .. 2>&1; cat ../outer-only ../../outer-only 2>&1; cat " + up + strings.TrimPrefix(s.d.secretFile, "/") + " 2>&1; " +
		"cd -P " + up + " 2>&1 && pwd && ls 2>&1; cat /proc/self/cwd/../outer-only 2>&1"
	done := make(chan result, 1)
	go func() {
		res, err := s.run(t.Context(), holder, corral.ExecOptions{Shell: script, Timeout: 30 * time.Second})
		if err != nil {
			res.stderr += "exec: " + err.Error()
		}
		done <- res
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(inner, "held", "ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder never entered its directory: %+v", <-done)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res := s.sh(t, mover, "mv /w/inner/held /w/held && ls /w/held", 10*time.Second); res.ExitCode != 0 || res.stdout != "ready\n" {
		t.Fatalf("the mover's rename: exit %d, %q %q", res.ExitCode, res.stdout, res.stderr)
	}
	res := <-done
	out := res.stdout + res.stderr
	if strings.Contains(out, "not moved") {
		t.Fatalf("the holder never saw its directory move:\n%s", out)
	}
	if strings.Contains(out, marker) || strings.Contains(out, s.d.secret) {
		t.Fatalf("walking .. from a directory moved out of its mount reached files outside the mount:\n%s", out)
	}
	t.Logf("the holder after the move:\n%s", out)
}
