package corral

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Upload extracts the tar stream r into the directory dir of a sandbox,
// creating dir. The sandbox refuses entries that would land outside dir.
// r is streamed, never held whole.
func (c *Client) Upload(ctx context.Context, id, dir string, r io.Reader) error {
	resp, err := c.do(ctx, "PUT", filesPath(id, "/archive"), pathQuery(dir), r, "application/x-tar")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Download streams a tar of path in a sandbox: the file itself, or a
// directory's contents with names relative to it. The caller closes the
// reader. Treat the names in it as untrusted (DownloadDir does).
func (c *Client) Download(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, "GET", filesPath(id, "/archive"), pathQuery(path), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadDir copies the contents of the local directory localDir into
// remoteDir in a sandbox (created if missing), as a tar stream built while
// it is sent. Regular files, directories and symbolic links (as links) are
// copied with their permission bits and times; ownership is not (files
// belong to root in the sandbox), nor are other file types.
func (c *Client) UploadDir(ctx context.Context, id, localDir, remoteDir string) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := WriteTar(pw, localDir)
		_ = pw.CloseWithError(err)
		done <- err
	}()
	err := c.Upload(ctx, id, remoteDir, pr)
	// Ends the writer if the upload stopped reading early.
	_ = pr.CloseWithError(errors.New("upload ended"))
	if werr := <-done; werr != nil {
		return werr
	}
	return err
}

// DownloadDir copies path in a sandbox (a directory's contents, or a file)
// into the local directory localDir, created if missing. The archive is
// untrusted: entries with absolute names or ".." are refused, and nothing
// is written through a symbolic link that leads outside localDir (see
// ExtractTar).
func (c *Client) DownloadDir(ctx context.Context, id, remotePath, localDir string) error {
	rc, err := c.Download(ctx, id, remotePath)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := os.MkdirAll(localDir, 0o755); err != nil {
		return err
	}
	return ExtractTar(rc, localDir)
}

// WriteTar writes a tar stream of the contents of directory dir to w, with
// names relative to dir. Symbolic links are stored as links, not followed;
// file types other than regular files, directories and links are skipped;
// owners are not recorded.
func WriteTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case info.Mode().IsRegular(), info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("archiving %s: %w", p, err)
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		// A file that changed size while being read fails here rather
		// than producing a corrupt archive.
		if _, err := io.Copy(tw, f); err != nil {
			return fmt.Errorf("archiving %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// ExtractTar extracts the tar stream r into the existing directory dir,
// treating it as untrusted: an entry whose name is absolute or contains
// ".." is refused, as is any write that would pass through a symbolic link
// leading outside dir (the extraction works inside an os.Root). Symbolic
// links are created as they are, pointing wherever they say; nothing
// follows them out. Regular files, directories, symbolic and hard links
// are extracted with their permission bits (no setuid, setgid or sticky)
// and modification times; other types are skipped; ownership is not set.
// An existing non-directory at an entry's name is replaced.
func ExtractTar(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	var dirs []dirMode
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue // the destination itself
		}
		d, err := extractEntry(root, tr, hdr, name)
		if err != nil {
			return err
		}
		if d != nil {
			dirs = append(dirs, *d)
		}
	}
	return setDirModes(root, dirs)
}

// dirMode is the metadata of an extracted directory, applied once the
// whole archive is in.
type dirMode struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

// extractEntry extracts the entry hdr, whose clean name is name, from tr
// into root. For a directory it returns the mode and time to apply last,
// so that a read-only directory can still be filled.
func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string) (*dirMode, error) {
	wrap := func(err error) error { return fmt.Errorf("extracting %s: %w", hdr.Name, err) }
	perm := fs.FileMode(hdr.Mode) & fs.ModePerm
	if parent := path.Dir(name); parent != "." {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return nil, wrap(err)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, 0o755); err != nil {
			return nil, wrap(err)
		}
		return &dirMode{name, perm, hdr.ModTime}, nil
	case tar.TypeReg:
		if err := replaceable(root, name); err != nil {
			return nil, wrap(err)
		}
		if err := extractFile(root, name, perm, tr); err != nil {
			return nil, wrap(err)
		}
		if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
			return nil, wrap(err)
		}
	case tar.TypeSymlink:
		if err := replaceable(root, name); err != nil {
			return nil, wrap(err)
		}
		// No times: they would be set on its target.
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return nil, wrap(err)
		}
	case tar.TypeLink:
		target, err := entryName(hdr.Linkname)
		if err != nil {
			return nil, err
		}
		if err := replaceable(root, name); err != nil {
			return nil, wrap(err)
		}
		if err := root.Link(target, name); err != nil {
			return nil, wrap(err)
		}
	}
	return nil, nil
}

// setDirModes applies the directories' modes and times, deepest first, so
// that setting a parent's time is the last change inside it.
func setDirModes(root *os.Root, dirs []dirMode) error {
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("extracting %s: %w", d.name, err)
		}
		if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return fmt.Errorf("extracting %s: %w", d.name, err)
		}
	}
	return nil
}

// entryName cleans a tar entry name into a path relative to the
// destination, refusing names that are absolute or climb out with "..".
func entryName(name string) (string, error) {
	n := strings.TrimSuffix(name, "/")
	if n == "" {
		return ".", nil
	}
	if path.IsAbs(n) || strings.HasPrefix(n, `\`) {
		return "", fmt.Errorf("archive entry %q has an absolute name", name)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("archive entry %q leaves the destination directory", name)
		}
	}
	return path.Clean(n), nil
}

// replaceable removes what stands at name unless it is a directory, so
// that an entry replaces it (rather than writing through a link).
func replaceable(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("a directory is in the way")
	}
	return root.Remove(name)
}

func extractFile(root *os.Root, name string, perm fs.FileMode, r io.Reader) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil { // the umask narrowed it
		f.Close()
		return err
	}
	return f.Close()
}

// WatchEvent is one change under a watched directory.
type WatchEvent struct {
	// Type is "create", "write", "remove", "rename" or "chmod";
	// "overflow" means events were lost and the client should rescan.
	Type string `json:"type"`
	// Path is absolute inside the sandbox.
	Path string `json:"path"`
	// OldPath is, on a rename within the watched tree, where the entry
	// was before; a rename without it moved the entry at Path out of the
	// tree.
	OldPath string    `json:"old_path,omitempty"`
	Time    time.Time `json:"time"`
	IsDir   bool      `json:"is_dir,omitempty"`
}

// Watch streams changes under the directory path (and below it when
// recursive) to fn until ctx ends (returning ctx's error), fn returns an
// error (returning it), the watch fails, or the directory itself is
// removed or moved (returning nil). The watch is in place a moment after
// the call starts; changes made before that are not reported.
func (c *Client) Watch(ctx context.Context, id, path string, recursive bool, fn func(WatchEvent) error) error {
	q := pathQuery(path)
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.do(ctx, "GET", filesPath(id, "/watch"), q, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		var ev struct {
			WatchEvent
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("decoding watch event: %w", err)
		}
		if ev.Type == "error" {
			e := execEvent{Error: ev.Error}
			return e.err()
		}
		if err := fn(ev.WatchEvent); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading watch stream: %w", err)
	}
	return nil
}
