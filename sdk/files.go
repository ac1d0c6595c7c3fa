package corral

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"time"
)

// FileInfo describes a file inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	Target  string    `json:"target,omitempty"`
}

// File types in FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

func filesPath(id, suffix string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + "/files" + suffix
}

func pathQuery(p string) url.Values { return url.Values{"path": {p}} }

// ReadFile streams a file out of a sandbox; the caller closes the reader.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, "GET", filesPath(id, ""), pathQuery(path), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile streams r into a file in a sandbox, creating parent
// directories, and returns the new file's info.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode os.FileMode) (*FileInfo, error) {
	q := pathQuery(path)
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%o", unixMode(mode)))
	}
	resp, err := c.do(ctx, "PUT", filesPath(id, ""), q, r, "application/octet-stream")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	if err := decodeJSON(resp.Body, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Stat describes one file.
func (c *Client) Stat(ctx context.Context, id, path string) (*FileInfo, error) {
	var fi FileInfo
	if err := c.doJSON(ctx, "GET", filesPath(id, "/stat"), pathQuery(path), nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// ListDir lists a directory, sorted by name.
func (c *Client) ListDir(ctx context.Context, id, path string) ([]FileInfo, error) {
	var out []FileInfo
	if err := c.doJSON(ctx, "GET", filesPath(id, "/list"), pathQuery(path), nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Mkdir creates a directory (and its parents when parents is true).
func (c *Client) Mkdir(ctx context.Context, id, path string, parents bool) (*FileInfo, error) {
	var fi FileInfo
	body := map[string]any{"path": path, "parents": parents}
	if err := c.doJSON(ctx, "POST", filesPath(id, "/mkdir"), nil, body, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Remove deletes a file, or a directory tree when recursive is true.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := pathQuery(path)
	if recursive {
		q.Set("recursive", "true")
	}
	return c.doJSON(ctx, "DELETE", filesPath(id, ""), q, nil, nil)
}

// Rename moves a file inside a sandbox.
func (c *Client) Rename(ctx context.Context, id, from, to string) (*FileInfo, error) {
	var fi FileInfo
	if err := c.doJSON(ctx, "POST", filesPath(id, "/rename"), nil, map[string]string{"from": from, "to": to}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// unixMode converts Go's file mode bits to Unix permission bits, keeping
// setuid, setgid and sticky.
func unixMode(m os.FileMode) uint32 {
	v := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}
