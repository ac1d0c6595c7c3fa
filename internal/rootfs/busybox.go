package rootfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// FillBusybox writes a minimal rootfs into dir: a static busybox with one
// symlink per applet, /etc/passwd and /etc/group with root and "user"
// (uid 1000), and the empty mount points a runtime expects. It is one
// binary and a few files and builds in milliseconds, which makes it the
// template tests use.
func FillBusybox(dir, busybox string) error {
	if busybox == "" {
		busybox = BusyboxPath
	}
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("listing busybox applets of %s: %w", busybox, err)
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "root", "home/user", "run", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777|os.ModeSticky); err != nil {
		return err
	}
	if err := os.Chown(filepath.Join(dir, "home/user"), 1000, 1000); err != nil {
		return err
	}
	if err := copyFile(busybox, filepath.Join(dir, "bin/busybox"), 0o755); err != nil {
		return err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "bin/busybox" {
			continue
		}
		link := filepath.Join(dir, applet)
		rel, err := filepath.Rel(filepath.Dir(link), filepath.Join(dir, "bin/busybox"))
		if err != nil {
			return err
		}
		if err := os.Symlink(rel, link); err != nil && !os.IsExist(err) {
			return fmt.Errorf("linking applet %s: %w", applet, err)
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
		"etc/hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
		"etc/hostname": "sandbox\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Close()
}
