package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/corralrun/corral/internal/rootfs"
)

// Peer names, usable in Options.Peers.
const (
	PeerRunc   = "runc"
	PeerRunsc  = "runsc"
	PeerBwrap  = "bwrap"
	PeerPodman = "podman"
)

// AllPeers are the peers run by default, in the order they are reported.
func AllPeers() []string { return []string{PeerRunc, PeerRunsc, PeerBwrap, PeerPodman} }

// peer runs `echo hi` once in a fresh container of some other tool.
type peer struct {
	name string
	// argv returns the command for one run with container id id.
	argv func(id string) []string
	// cleanup force-removes container id after a run, if the tool keeps state.
	cleanup func(id string)
	// For the OCI runtimes: start returns the command that starts
	// container id detached on the exec bundle, and exec the command that
	// runs /bin/true in it; nil for peers without an exec of their own.
	start, exec func(id string) []string
}

// peerSet is the bundle the peers share and the peers found on this host.
// It is used by one goroutine.
type peerSet struct {
	dir   string // temp dir holding the bundle and the runtimes' state
	peers []peer
	notes []string
}

// newPeerSet builds a busybox OCI bundle in a temp dir (rootfs from
// rootfs.FillBusybox, config from `runc spec` with args [echo hi] and no
// terminal) and returns the wanted peers that are installed. The caller
// calls close.
func newPeerSet(ctx context.Context, want []string, busybox string) (*peerSet, error) {
	dir, err := os.MkdirTemp("", "corral-bench-")
	if err != nil {
		return nil, fmt.Errorf("creating peer bundle dir: %w", err)
	}
	ps := &peerSet{dir: dir}
	if err := ps.makeBundle(ctx, busybox); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	rootfs := filepath.Join(dir, "rootfs")
	for _, name := range want {
		bin, err := exec.LookPath(name)
		if err != nil {
			ps.notes = append(ps.notes, fmt.Sprintf("peer %s skipped: not installed", name))
			continue
		}
		switch name {
		case PeerRunc, PeerRunsc:
			root := filepath.Join(dir, name+"-state")
			global := []string{bin, "--root", root}
			if name == PeerRunsc {
				global = append(global, "--platform", "systrap", "--network", "none", "--overlay2", "none")
			}
			ps.peers = append(ps.peers, peer{
				name: name,
				argv: func(id string) []string {
					return append(append([]string{}, global...), "run", "--bundle", dir, id)
				},
				cleanup: func(id string) {
					_ = exec.Command(bin, "--root", root, "delete", "--force", id).Run()
				},
				start: func(id string) []string {
					return append(append([]string{}, global...), "run", "--detach", "--bundle", ps.execBundle(), id)
				},
				exec: func(id string) []string {
					return append(append([]string{}, global...), "exec", id, "/bin/true")
				},
			})
		case PeerBwrap:
			ps.peers = append(ps.peers, peer{name: name, argv: func(string) []string {
				return []string{bin, "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "echo", "hi"}
			}})
		case PeerPodman:
			ps.peers = append(ps.peers, peer{
				name: name,
				argv: func(id string) []string {
					return []string{bin, "run", "--rm", "--name", id, "--network", "none", "--rootfs", rootfs, "echo", "hi"}
				},
				cleanup: func(id string) { _ = exec.Command(bin, "rm", "--force", id).Run() },
			})
		default:
			ps.notes = append(ps.notes, fmt.Sprintf("peer %s skipped: unknown", name))
		}
	}
	return ps, nil
}

func (ps *peerSet) makeBundle(ctx context.Context, busybox string) error {
	if err := rootfs.FillBusybox(filepath.Join(ps.dir, "rootfs"), busybox); err != nil {
		return fmt.Errorf("building peer rootfs: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "runc", "spec", "-b", ps.dir).CombinedOutput(); err != nil {
		return fmt.Errorf("running runc spec: %w: %s", err, out)
	}
	path := filepath.Join(ps.dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading peer config: %w", err)
	}
	if err := writeConfig(path, raw, ps.dir, []string{"echo", "hi"}); err != nil {
		return err
	}
	// The exec bundle: the same container, with a process that waits.
	if err := os.Mkdir(ps.execBundle(), 0o755); err != nil {
		return fmt.Errorf("creating peer exec bundle: %w", err)
	}
	return writeConfig(filepath.Join(ps.execBundle(), "config.json"), raw, ps.dir, []string{"sleep", "1000000"})
}

// execBundle is the bundle of the containers that peers exec into.
func (ps *peerSet) execBundle() string { return filepath.Join(ps.dir, "exec") }

// writeConfig writes the runc spec raw to path with args as the process,
// no terminal, and the rootfs of the bundle in dir.
func writeConfig(path string, raw []byte, dir string, args []string) error {
	// Edit as a generic map so every field runc spec wrote is kept as is.
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("decoding peer config: %w", err)
	}
	proc, ok := cfg["process"].(map[string]any)
	if !ok {
		return errors.New("peer config has no process")
	}
	proc["terminal"] = false
	proc["args"] = args
	root, ok := cfg["root"].(map[string]any)
	if !ok {
		return errors.New("peer config has no root")
	}
	root["path"] = filepath.Join(dir, "rootfs")
	out, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encoding peer config: %w", err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("writing peer config: %w", err)
	}
	return nil
}

// startExecTarget starts a detached container of p on the exec bundle and
// returns its ID; the caller removes it with p.cleanup.
func (ps *peerSet) startExecTarget(ctx context.Context, p peer) (string, error) {
	id := "corral-bench-exec-" + randHex(4)
	argv := p.start(id)
	// The detached container keeps the command's stdout and stderr, so
	// they go to a file: through a pipe, the output would not end until
	// the container does.
	out, err := os.CreateTemp(ps.dir, "start-*.log")
	if err != nil {
		return "", fmt.Errorf("starting peer %s for exec: %w", p.name, err)
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		p.cleanup(id)
		msg, _ := os.ReadFile(out.Name())
		return "", fmt.Errorf("starting peer %s for exec: %w: %s", p.name, err, msg)
	}
	return id, nil
}

// execOnce runs /bin/true in p's container id and returns the time from
// starting the command to its exit.
func (ps *peerSet) execOnce(ctx context.Context, p peer, id string) (time.Duration, error) {
	argv := p.exec(id)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("exec in peer %s: %w: %s", p.name, err, stderr.b)
	}
	return time.Since(start), nil
}

// run runs p once and returns the time from starting the command to the
// first byte on its stdout. The container is removed before it returns.
func (ps *peerSet) run(ctx context.Context, p peer) (time.Duration, error) {
	id := "corral-bench-" + randHex(4)
	if p.cleanup != nil {
		defer p.cleanup(id)
	}
	argv := p.argv(id)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, fmt.Errorf("running peer %s: %w", p.name, err)
	}
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("running peer %s: %w", p.name, err)
	}
	var first [1]byte
	_, readErr := io.ReadFull(stdout, first[:])
	at := time.Since(start)
	_, _ = io.Copy(io.Discard, stdout)
	waitErr := cmd.Wait()
	if readErr != nil || waitErr != nil {
		return 0, fmt.Errorf("running peer %s: %w: %s", p.name, errors.Join(readErr, waitErr), stderr.b)
	}
	return at, nil
}

// close removes the bundle and the peers' state.
func (ps *peerSet) close() error {
	if err := os.RemoveAll(ps.dir); err != nil {
		return fmt.Errorf("removing peer bundle: %w", err)
	}
	return nil
}

// limitedBuffer keeps the first 4 KiB written to it, for error messages.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
