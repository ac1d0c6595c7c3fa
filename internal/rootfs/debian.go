package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// DefaultDebianMirror is the mirror BuildDebian uses when
// DebianOptions.Mirror is empty.
const DefaultDebianMirror = "http://deb.debian.org/debian"

// DebianSuite is the Debian release BuildDebian installs.
const DebianSuite = "bookworm"

// debianPackages are what a coding agent expects to find, installed with
// apt on top of debootstrap's minbase.
var debianPackages = []string{
	"bash", "coreutils", "python3", "python3-pip", "python3-venv", "nodejs", "npm",
	"git", "curl", "ca-certificates", "procps", "less", "python3-requests",
}

// CodeInterpreterPackages are what the code-interpreter recipe adds to
// the Debian template: a Jupyter kernel for Python and the libraries whose
// results the interpreter shows richly (data frames, charts).
var CodeInterpreterPackages = []string{
	"python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib",
}

// DebianOptions tune BuildDebian. The zero value builds the default
// template from DefaultDebianMirror.
type DebianOptions struct {
	// Mirror is the Debian archive to install from; empty means
	// DefaultDebianMirror. It is also what the tree's apt sources name.
	Mirror string
	// BuildEssential adds build-essential (gcc, make, libc headers), a
	// few hundred megabytes more.
	BuildEssential bool
	// Extra are more Debian packages to install (CodeInterpreterPackages
	// for the code-interpreter recipe).
	Extra []string
	// Warm is a command run in the finished tree as "user", for caches the
	// first use would otherwise build (matplotlib's font cache); empty
	// runs nothing.
	Warm string
	// Debootstrap is the debootstrap program to run; empty means the one
	// on PATH, else /usr/sbin/debootstrap.
	Debootstrap string
}

// BuildDebian fills dir with a Debian bookworm rootfs for coding agents:
// debootstrap --variant=minbase, then apt-get installs bash, coreutils,
// python3 with pip, venv and requests, nodejs, npm, git, curl,
// ca-certificates, procps and less (plus build-essential when asked). It then cleans apt's
// caches and lists, writes /etc/hostname and /etc/hosts, leaves
// /etc/resolv.conf an empty regular file (the runtime provides DNS), and
// adds the unprivileged account "user" (uid and gid 1000, home /home/user,
// shell /bin/bash, password locked).
//
// The packages are installed with apt inside a chroot rather than with
// debootstrap --include, because debootstrap's resolver cannot satisfy
// npm's dependencies in bookworm (configuration fails on missing node-*
// packages).
//
// dir must be empty or absent. It needs root, debootstrap, chroot and
// unshare (util-linux), and network access to the mirror. Every step runs
// in a private mount namespace, so the /proc and /sys mounts that
// debootstrap and package scripts make disappear with the processes, even
// when they are killed: the tree is left without mounts. All output goes to
// progress (nil discards it).
//
// Cost: minutes, mostly waiting for the mirror, and hundreds of megabytes
// (docs/BENCHMARKS.md). If ctx is canceled the running step's whole
// process group is killed and BuildDebian returns an error wrapping
// ctx.Err(). On any error dir holds a partial tree for the caller to
// remove.
func BuildDebian(ctx context.Context, dir string, opts DebianOptions, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	mirror := opts.Mirror
	if mirror == "" {
		mirror = DefaultDebianMirror
	}
	debootstrap, err := findDebootstrap(opts.Debootstrap)
	if err != nil {
		return err
	}
	// unshare --mount-proc and chroot want an absolute path.
	if dir, err = filepath.Abs(dir); err != nil {
		return fmt.Errorf("resolving rootfs directory: %w", err)
	}
	if err := checkEmptyDir(dir); err != nil {
		return err
	}

	fmt.Fprintf(progress, "corral: debootstrap %s (minbase) from %s\n", DebianSuite, mirror)
	if err := runIsolated(ctx, progress, nil, debootstrap, "--variant=minbase", DebianSuite, dir, mirror); err != nil {
		return fmt.Errorf("bootstrapping debian %s into %s: %w", DebianSuite, dir, err)
	}

	pkgs := slices.Clone(debianPackages)
	if opts.BuildEssential {
		pkgs = append(pkgs, "build-essential")
	}
	pkgs = append(pkgs, opts.Extra...)
	fmt.Fprintf(progress, "corral: installing %s\n", strings.Join(pkgs, " "))
	if err := installPackages(ctx, dir, pkgs, progress); err != nil {
		return fmt.Errorf("installing packages into %s: %w", dir, err)
	}

	fmt.Fprintf(progress, "corral: finishing %s\n", dir)
	if err := finishDebian(dir); err != nil {
		return fmt.Errorf("finishing debian tree %s: %w", dir, err)
	}
	if opts.Warm != "" {
		fmt.Fprintf(progress, "corral: warming caches: %s\n", opts.Warm)
		unshareOpts := []string{"--pid", "--fork", "--mount-proc=" + filepath.Join(dir, "proc")}
		if err := runIsolated(ctx, progress, unshareOpts, "chroot", fmt.Sprintf("--userspec=%d:%d", userID, userID), dir,
			"/bin/sh", "-ec", "cd /"+userHome+" && HOME=/"+userHome+" "+opts.Warm); err != nil {
			return fmt.Errorf("warming caches in %s: %w", dir, err)
		}
	}
	return nil
}

// CodeInterpreterWarm builds matplotlib's font cache in the user's home,
// which the first import of pyplot would otherwise spend seconds on.
const CodeInterpreterWarm = "python3 -c 'import matplotlib.pyplot'"

func findDebootstrap(p string) (string, error) {
	if p == "" {
		var err error
		if p, err = exec.LookPath("debootstrap"); err != nil {
			p = "/usr/sbin/debootstrap"
		}
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("finding debootstrap (apt-get install debootstrap): %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// checkEmptyDir creates dir if needed and refuses one with contents, since
// debootstrap over an existing tree gives a mix nobody asked for.
func checkEmptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating rootfs directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading rootfs directory: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("rootfs directory %s is not empty: %w", dir, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// policyRCD keeps package scripts from starting services in the tree
// while it is being built (invoke-rc.d's documented "action forbidden").
const policyRCD = "#!/bin/sh\nexit 101\n"

// installPackages runs apt-get inside the tree, with its own /proc, and
// cleans apt's package cache afterwards.
func installPackages(ctx context.Context, dir string, pkgs []string, progress io.Writer) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.WriteFile("usr/sbin/policy-rc.d", []byte(policyRCD), 0o755); err != nil {
		return fmt.Errorf("writing policy-rc.d: %w", err)
	}
	script := `apt-get -o Acquire::Retries=3 update
apt-get -o Acquire::Retries=3 install -y --no-install-recommends "$@"
apt-get clean`
	unshareOpts := []string{"--pid", "--fork", "--mount-proc=" + filepath.Join(dir, "proc")}
	command := append([]string{"chroot", dir, "/bin/sh", "-ec", script, "sh"}, pkgs...)
	if err := runIsolated(ctx, progress, unshareOpts, command...); err != nil {
		return err
	}
	if err := root.Remove("usr/sbin/policy-rc.d"); err != nil {
		return fmt.Errorf("removing policy-rc.d: %w", err)
	}
	return nil
}

// buildEnv is the environment of build steps: fixed, so that the host's
// locale or frontend settings do not leak into package scripts, but with
// the host's proxy settings, which the mirror may need.
func buildEnv() []string {
	env := []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LC_ALL=C",
		"DEBIAN_FRONTEND=noninteractive",
		"DEBCONF_NONINTERACTIVE_SEEN=true",
	}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// runIsolated runs command in a new private mount namespace (unshare,
// with unshareOpts added) and its own process group, writing its output to
// progress. If ctx is canceled the whole group is killed.
func runIsolated(ctx context.Context, progress io.Writer, unshareOpts []string, command ...string) error {
	argv := append([]string{"--mount", "--propagation", "private"}, unshareOpts...)
	cmd := exec.CommandContext(ctx, "unshare", append(argv, command...)...)
	cmd.Env = buildEnv()
	cmd.Stdout, cmd.Stderr = progress, progress
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Bounds the wait for stray processes that keep the output pipe open.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		return fmt.Errorf("running %s: %w", command[0], err)
	}
	return nil
}

// Files finishDebian writes.
const (
	debianHostname = "sandbox\n"
	debianHosts    = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
	userName       = "user"
	userHome       = "home/user"
	userID         = 1000
)

// finishDebian turns a freshly installed tree into a template: no apt
// lists, identity files, a resolv.conf that is not the host's, and the
// "user" account. It works through an os.Root so that symlinks in the tree
// (debootstrap may leave /etc/resolv.conf as one) never lead to the host,
// and it is idempotent.
func finishDebian(dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()

	if err := emptyDir(root, "var/lib/apt/lists"); err != nil {
		return err
	}
	for name, content := range map[string]string{
		"etc/hostname":    debianHostname,
		"etc/hosts":       debianHosts,
		"etc/resolv.conf": "",
	} {
		if err := replaceFile(root, name, content, 0o644); err != nil {
			return err
		}
	}
	return addUser(root)
}

// emptyDir removes everything inside dir, if dir exists.
func emptyDir(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	for _, n := range names {
		if err := root.RemoveAll(path.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// replaceFile puts a new regular file at name, replacing whatever was
// there, a symlink included.
func replaceFile(root *os.Root, name, content string, perm fs.FileMode) error {
	if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return root.Chmod(name, perm) // the umask may have narrowed perm
}

// addUser adds "user" to passwd, group, shadow and gshadow (the last two
// only if the tree has them) and creates its home from /etc/skel. Lines
// already present are left alone.
func addUser(root *os.Root) error {
	entries := []struct {
		file, line string
		required   bool
	}{
		{"etc/passwd", fmt.Sprintf("%s:x:%d:%d::/%s:/bin/bash", userName, userID, userID, userHome), true},
		{"etc/group", fmt.Sprintf("%s:x:%d:", userName, userID), true},
		{"etc/shadow", userName + ":!::0:99999:7:::", false},
		{"etc/gshadow", userName + ":!::", false},
	}
	for _, e := range entries {
		if err := appendEntry(root, e.file, e.line, e.required); err != nil {
			return err
		}
	}
	if err := root.MkdirAll(userHome, 0o755); err != nil {
		return err
	}
	if err := copySkel(root, "etc/skel", userHome); err != nil {
		return err
	}
	return root.Lchown(userHome, userID, userID)
}

// appendEntry adds line to a colon-separated account file unless an entry
// with the same name is there.
func appendEntry(root *os.Root, file, line string, required bool) error {
	data, err := root.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) && !required {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", file, err)
	}
	key := line[:bytes.IndexByte([]byte(line), ':')+1]
	for _, l := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(l, []byte(key)) {
			return nil
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		line = "\n" + line
	}
	f, err := root.OpenFile(file, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("appending to %s: %w", file, err)
	}
	return f.Close()
}

// copySkel copies the regular files, directories and symlinks of src into
// dst, owned by the user, without overwriting anything.
func copySkel(root *os.Root, src, dst string) error {
	return fs.WalkDir(root.FS(), src, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == src {
			return fs.SkipAll // no skeleton in this tree
		}
		if err != nil {
			return err
		}
		rel := p[len(src):]
		if rel == "" {
			return nil
		}
		target := dst + rel
		if _, err := root.Lstat(target); err == nil {
			return nil
		}
		switch {
		case d.IsDir():
			if err := root.Mkdir(target, 0o755); err != nil {
				return err
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := root.Readlink(p)
			if err != nil {
				return err
			}
			if err := root.Symlink(link, target); err != nil {
				return err
			}
		case d.Type().IsRegular():
			data, err := root.ReadFile(p)
			if err != nil {
				return err
			}
			if err := root.WriteFile(target, data, 0o644); err != nil {
				return err
			}
		default:
			return nil
		}
		return root.Lchown(target, userID, userID)
	})
}
