package hostile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	corral "github.com/corralrun/corral/sdk"
)

// testMountEscapes attacks the host directories a sandbox mounts: symlinks
// the sandbox plants in a rw mount toward host paths, attempts to unmount
// or remount its mounts, later mounts of what it planted, and a host-side
// rename race between the daemon's check of a source and its mount. None
// may show the host secret or change the read-only directory.
func testMountEscapes(t *testing.T, s *suite) {
	repo := filepath.Join(s.d.allowed, s.runtime+"-repo")
	ro := filepath.Join(s.d.allowed, s.runtime+"-ro")
	for _, d := range []string{repo, ro} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(repo, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ro, "keep"), []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := s.create(t, corral.CreateOptions{Mounts: []corral.Mount{
		{Source: repo, Target: "/w"},
		{Source: ro, Target: "/ro", Mode: corral.MountReadOnly},
	}})

	secret := s.d.secretFile
	res := s.sh(t, id, "ln -s "+secret+" /w/esc; ln -s / /w/root; ln -s .. /w/up; "+
		"cat /w/esc /w/root"+secret+" /w/up/up"+secret+" 2>&1; "+
		"umount /ro 2>&1; umount -l /w 2>&1; mount -o remount,rw /ro 2>&1; mount --bind /w /ro 2>&1; "+
		"echo x > /ro/keep 2>&1; touch /ro/new 2>&1; cat /ro/keep", 30*time.Second)
	if strings.Contains(res.stdout+res.stderr, s.d.secret) {
		t.Fatalf("the sandbox read the host secret through its mounts:\n%s%s", res.stdout, res.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ro, "keep")); err != nil || string(b) != "keep\n" {
		t.Fatalf("the read-only directory's file became %q (%v)", b, err)
	}
	if _, err := os.Stat(filepath.Join(ro, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox made a file in its read-only directory: %v", err)
	}
	if !strings.HasSuffix(res.stdout, "keep\n") {
		t.Fatalf("after the attempts the read-only mount reads %q", res.stdout)
	}

	// What the sandbox planted cannot be mounted by a later sandbox.
	for _, src := range []string{filepath.Join(repo, "esc"), filepath.Join(repo, "root", "etc"), filepath.Join(repo, "up")} {
		_, err := s.d.Client.Create(t.Context(), corral.CreateOptions{Template: "bb", Runtime: s.runtime,
			Mounts: []corral.Mount{{Source: src, Target: "/x", Mode: corral.MountReadOnly}}})
		if code := corral.ErrorCode(err); code != corral.CodeInvalidArgument && code != corral.CodePermissionDenied {
			t.Fatalf("mounting %s, planted by a sandbox: %v; want a refusal", src, err)
		}
	}
	testMountRenameRace(t, s)
	testMountNestedRename(t, s)
}

// testMountRenameRace swaps, on the host and as fast as it can, a real
// directory beneath the allowed root with a symlink to the directory that
// holds the secret, while sandboxes are created that mount the path. Each
// create must fail or see the real directory.
func testMountRenameRace(t *testing.T, s *suite) {
	race := filepath.Join(s.d.allowed, s.runtime+"-race")
	link := race + "-link"
	if err := os.MkdirAll(race, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(race, "inside"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(s.d.secretFile), link); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = unix.Renameat2(unix.AT_FDCWD, race, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE)
		}
	}()
	var created, refused int
	for range 10 {
		sb, err := s.d.Client.Create(t.Context(), corral.CreateOptions{Template: "bb", Runtime: s.runtime,
			Mounts: []corral.Mount{{Source: race, Target: "/m", Mode: corral.MountReadOnly}}})
		if err != nil {
			if code := corral.ErrorCode(err); code != corral.CodeInvalidArgument {
				close(stop)
				wg.Wait()
				t.Fatalf("create during the race: %v; want success or invalid_argument", err)
			}
			refused++
			continue
		}
		created++
		res := s.sh(t, sb.ID, "ls /m; cat /m/"+filepath.Base(s.d.secretFile)+" 2>/dev/null", 10*time.Second)
		if err := s.d.Client.Delete(t.Context(), sb.ID); err != nil {
			t.Errorf("deleting %s: %v", sb.ID, err)
		}
		if strings.Contains(res.stdout, s.d.secret) || res.stdout != "inside\n" {
			close(stop)
			wg.Wait()
			t.Fatalf("a sandbox created during the race sees %q in its mount, want only the real directory", res.stdout)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("during the rename race: %d creates saw the real directory, %d were refused", created, refused)
}
