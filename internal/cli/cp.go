package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	corral "github.com/corralrun/corral/sdk"
)

// cp copies files between the host and a sandbox: `corral cp SRC DST`,
// where exactly one of SRC and DST is ID:/absolute/path. It follows
// docker cp's rules:
//
//   - a file onto a missing path creates that file (a missing path ending
//     in / is an error); onto a file replaces it; onto a directory goes
//     inside it under its own name;
//   - a directory onto a missing path creates it with the directory's
//     contents; onto a directory goes inside it under its own name, or
//     only its contents when SRC ends in "/."; onto a file is an error.
//
// Directories travel as tar streams, files as plain streams; neither is
// held in memory. Downloads are treated as untrusted (see
// corral.ExtractTar). Symbolic links inside a copied directory are copied
// as links.
func (c *cli) cp(args []string) int {
	fs := c.flags("cp")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	const usageLine = "usage: corral cp SRC ID:/PATH | corral cp ID:/PATH DST"
	if fs.NArg() != 2 {
		fmt.Fprintln(c.env.Stderr, usageLine)
		return exitUsage
	}
	srcID, srcPath, srcRemote := splitRemote(fs.Arg(0))
	dstID, dstPath, dstRemote := splitRemote(fs.Arg(1))
	if srcRemote == dstRemote {
		fmt.Fprintln(c.env.Stderr, "corral cp: exactly one of SRC and DST must be ID:/path")
		fmt.Fprintln(c.env.Stderr, usageLine)
		return exitUsage
	}
	client, err := c.client()
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	ctx, cancel := signalContext()
	defer cancel()
	if dstRemote {
		err = upload(ctx, client, srcPath, dstID, dstPath)
	} else {
		err = download(ctx, client, srcID, srcPath, dstPath)
	}
	if err != nil {
		return c.fail(err)
	}
	return 0
}

// splitRemote splits "ID:/path". A local path that contains ':' in its
// first component needs a "./" prefix.
func splitRemote(arg string) (id, p string, remote bool) {
	id, p, ok := strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") || !strings.HasPrefix(p, "/") {
		return "", arg, false
	}
	return id, p, true
}

// contentsOnly reports whether a source path ends in "/.", docker's way of
// saying "this directory's contents, not the directory".
func contentsOnly(p string) bool {
	return strings.HasSuffix(p, "/.") || p == "."
}

func upload(ctx context.Context, client *corral.Client, src, id, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	kind, err := remoteKind(ctx, client, id, dst)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		target := dst
		switch {
		case kind == corral.FileTypeDir:
			target = path.Join(dst, filepath.Base(src))
		case kind == "" && strings.HasSuffix(dst, "/"):
			return fmt.Errorf("destination directory %s does not exist in sandbox %s", dst, id)
		}
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = client.WriteFile(ctx, id, target, f, st.Mode().Perm())
		return err
	}
	target := dst
	switch kind {
	case "":
	case corral.FileTypeDir:
		if !contentsOnly(src) {
			target = path.Join(dst, filepath.Base(filepath.Clean(src)))
		}
	default:
		return fmt.Errorf("cannot copy directory %s onto %s in sandbox %s, which is not a directory", src, dst, id)
	}
	return client.UploadDir(ctx, id, src, target)
}

func download(ctx context.Context, client *corral.Client, id, src, dst string) error {
	kind, err := remoteKind(ctx, client, id, src)
	if err != nil {
		return err
	}
	st, err := os.Stat(dst)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	switch kind {
	case "":
		return fmt.Errorf("%s does not exist in sandbox %s", src, id)
	case corral.FileTypeDir:
		target := dst
		if exists {
			if !st.IsDir() {
				return fmt.Errorf("cannot copy directory %s onto %s, which is not a directory", src, dst)
			}
			if base := path.Base(path.Clean(src)); !contentsOnly(src) && base != "/" {
				target = filepath.Join(dst, base)
			}
		}
		return client.DownloadDir(ctx, id, src, target)
	case corral.FileTypeFile:
		target := dst
		switch {
		case exists && st.IsDir():
			target = filepath.Join(dst, path.Base(src))
		case !exists && strings.HasSuffix(dst, string(filepath.Separator)):
			return fmt.Errorf("destination directory %s does not exist", dst)
		}
		return downloadFile(ctx, client, id, src, target)
	}
	return fmt.Errorf("cannot copy %s from sandbox %s: it is a %s, not a file or directory", src, id, kind)
}

func downloadFile(ctx context.Context, client *corral.Client, id, src, target string) error {
	info, err := client.Stat(ctx, id, src)
	if err != nil {
		return err
	}
	r, err := client.ReadFile(ctx, id, src)
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fs.FileMode(info.Mode)&fs.ModePerm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("downloading %s: %w", src, err)
	}
	return f.Close()
}

// remoteKind returns the type of p in the sandbox ("file", "dir", ...),
// following symbolic links, or "" when nothing is there.
func remoteKind(ctx context.Context, client *corral.Client, id, p string) (string, error) {
	for range 16 {
		info, err := client.Stat(ctx, id, p)
		if corral.ErrorCode(err) == corral.CodeNotFound {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if info.Type != corral.FileTypeSymlink {
			return info.Type, nil
		}
		if path.IsAbs(info.Target) {
			p = info.Target
		} else {
			p = path.Join(path.Dir(path.Clean(p)), info.Target)
		}
	}
	return "", fmt.Errorf("too many levels of symbolic links at %s in sandbox %s", p, id)
}
