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
	return c.readFileAt(ctx, filesPath(id, ""), path)
}

// WriteFile streams r into a file in a sandbox, creating parent
// directories, and returns the new file's info.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode os.FileMode) (*FileInfo, error) {
	return c.writeFileAt(ctx, filesPath(id, ""), path, r, mode)
}

// Stat describes one file.
func (c *Client) Stat(ctx context.Context, id, path string) (*FileInfo, error) {
	return c.statAt(ctx, filesPath(id, "/stat"), path)
}

// ListDir lists a directory, sorted by name.
func (c *Client) ListDir(ctx context.Context, id, path string) ([]FileInfo, error) {
	return c.listAt(ctx, filesPath(id, "/list"), path)
}

// Mkdir creates a directory (and its parents when parents is true).
func (c *Client) Mkdir(ctx context.Context, id, path string, parents bool) (*FileInfo, error) {
	return c.mkdirAt(ctx, filesPath(id, "/mkdir"), path, parents)
}

// Remove deletes a file, or a directory tree when recursive is true.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := pathQuery(path)
	if recursive {
		q.Set("recursive", "true")
	}
	return c.doJSON(ctx, "DELETE", filesPath(id, ""), q, nil, nil)
}

// The file endpoints of sandboxes and volumes share their shapes; these
// take the endpoint's URL path.

func (c *Client) readFileAt(ctx context.Context, endpoint, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, "GET", endpoint, pathQuery(path), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

func (c *Client) writeFileAt(ctx context.Context, endpoint, path string, r io.Reader, mode os.FileMode) (*FileInfo, error) {
	q := pathQuery(path)
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%o", unixMode(mode)))
	}
	resp, err := c.do(ctx, "PUT", endpoint, q, r, "application/octet-stream")
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

func (c *Client) statAt(ctx context.Context, endpoint, path string) (*FileInfo, error) {
	var fi FileInfo
	if err := c.doJSON(ctx, "GET", endpoint, pathQuery(path), nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

func (c *Client) listAt(ctx context.Context, endpoint, path string) ([]FileInfo, error) {
	var out []FileInfo
	if err := c.doJSON(ctx, "GET", endpoint, pathQuery(path), nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *Client) mkdirAt(ctx context.Context, endpoint, path string, parents bool) (*FileInfo, error) {
	var fi FileInfo
	body := map[string]any{"path": path, "parents": parents}
	if err := c.doJSON(ctx, "POST", endpoint, nil, body, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
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
