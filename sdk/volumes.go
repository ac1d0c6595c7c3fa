package corral

import (
	"context"
	"io"
	"net/url"
	"os"
	"time"
)

// Volume is a named tree of files that outlives sandboxes. Several
// sandboxes may mount it at once (Mount.Volume).
type Volume struct {
	Name string `json:"name"`
	// Tenant owns the volume; "" is the operator's.
	Tenant string `json:"tenant,omitempty"`
	// SizeBytes limits the bytes written into the volume; 0 is none.
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// UsedBytes is what the volume takes, as well as the daemon can tell
	// cheaply.
	UsedBytes int64             `json:"used_bytes"`
	CreatedAt time.Time         `json:"created_at"`
	Labels    map[string]string `json:"labels,omitempty"`
	// InUseBy lists the sandboxes that mount the volume.
	InUseBy []string `json:"in_use_by,omitempty"`
}

// VolumeOptions are the settings of a new volume. A SizeBytes above 0
// needs a daemon on btrfs storage; others refuse it
// (CodeNotImplemented).
type VolumeOptions struct {
	SizeBytes int64             `json:"size_bytes,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

func volumePath(name, rest string) string { return "/v1/volumes/" + url.PathEscape(name) + rest }

// CreateVolume makes an empty volume; an existing name is
// CodeAlreadyExists.
func (c *Client) CreateVolume(ctx context.Context, name string, o VolumeOptions) (*Volume, error) {
	body := struct {
		Name string `json:"name"`
		VolumeOptions
	}{name, o}
	var v Volume
	if err := c.doJSON(ctx, "POST", "/v1/volumes", nil, body, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Volume returns one volume.
func (c *Client) Volume(ctx context.Context, name string) (*Volume, error) {
	var v Volume
	if err := c.doJSON(ctx, "GET", volumePath(name, ""), nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Volumes lists the volumes by name.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var out []Volume
	if err := c.doJSON(ctx, "GET", "/v1/volumes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteVolume removes a volume and its files; one that a sandbox mounts
// is CodeFailedPrecondition.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.doJSON(ctx, "DELETE", volumePath(name, ""), nil, nil, nil)
}

// The file methods of a volume take paths absolute inside it ("/" is its
// top); nothing outside it is reachable.

// VolumeReadFile streams a file of a volume; the caller closes it.
func (c *Client) VolumeReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return c.readFileAt(ctx, volumePath(name, "/files"), path)
}

// VolumeWriteFile streams r into a file of a volume, making parent
// directories, and returns the file's info. mode 0 is 0644.
func (c *Client) VolumeWriteFile(ctx context.Context, name, path string, r io.Reader, mode os.FileMode) (*FileInfo, error) {
	return c.writeFileAt(ctx, volumePath(name, "/files"), path, r, mode)
}

// VolumeStat describes one path of a volume.
func (c *Client) VolumeStat(ctx context.Context, name, path string) (*FileInfo, error) {
	return c.statAt(ctx, volumePath(name, "/files/stat"), path)
}

// VolumeListDir lists a directory of a volume.
func (c *Client) VolumeListDir(ctx context.Context, name, path string) ([]FileInfo, error) {
	return c.listAt(ctx, volumePath(name, "/files/list"), path)
}

// VolumeMkdir creates a directory in a volume (and its parents when
// parents is true).
func (c *Client) VolumeMkdir(ctx context.Context, name, path string, parents bool) (*FileInfo, error) {
	return c.mkdirAt(ctx, volumePath(name, "/files/mkdir"), path, parents)
}

// VolumeRemove deletes a path of a volume and everything under it.
func (c *Client) VolumeRemove(ctx context.Context, name, path string) error {
	return c.doJSON(ctx, "DELETE", volumePath(name, "/files"), pathQuery(path), nil, nil)
}
