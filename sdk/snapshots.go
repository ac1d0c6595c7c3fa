package corral

import (
	"context"
	"net/url"
	"time"
)

// Snapshot kinds (Snapshot.Kind, Runtime.Snapshot).
const (
	// SnapshotFilesystem holds files only: sandboxes made from it start
	// fresh processes on a copy of them (runc).
	SnapshotFilesystem = "filesystem"
	// SnapshotMemory holds files, memory and processes: sandboxes made
	// from it continue where the source was (gVisor).
	SnapshotMemory = "memory"
)

// Snapshot is a durable, named copy of a sandbox's state. It outlives the
// sandbox it was taken of and daemon restarts.
type Snapshot struct {
	Name      string            `json:"name"`
	Kind      string            `json:"kind"`
	SandboxID string            `json:"sandbox_id"`
	Template  string            `json:"template"`
	Runtime   string            `json:"runtime"`
	CPUs      float64           `json:"cpus"`
	MemoryMB  int64             `json:"memory_mb"`
	Pids      int64             `json:"pids"`
	DiskMB    int64             `json:"disk_mb,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Tenant owns the snapshot; "" is the operator's.
	Tenant    string    `json:"tenant,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"`
	// Mounts are the volumes sandboxes made from the snapshot mount;
	// with VolumesCopied they are the snapshot's own copies, of which
	// each such sandbox gets a copy.
	Mounts        []Mount `json:"mounts,omitempty"`
	VolumesCopied bool    `json:"volumes_copied,omitempty"`
}

func sandboxPath(id, action string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + "/" + action
}

// Pause freezes every process of a running sandbox until Resume.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, "POST", sandboxPath(id, "pause"), nil, map[string]any{}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Resume thaws a paused sandbox and sets its deadline to now + timeout;
// nil takes the daemon's default timeout, NoTimeout asks for none.
func (c *Client) Resume(ctx context.Context, id string, timeout *time.Duration) (*Sandbox, error) {
	return c.withDeadline(ctx, id, "resume", timeout)
}

// CreateSnapshot saves sandbox id under name, with metadata. What it
// holds depends on the runtime (Runtime.Snapshot).
func (c *Client) CreateSnapshot(ctx context.Context, id, name string, metadata map[string]string) (*Snapshot, error) {
	return c.CreateSnapshotWith(ctx, id, SnapshotOptions{Name: name, Metadata: metadata})
}

// SnapshotOptions are the settings of CreateSnapshotWith.
type SnapshotOptions struct {
	Name     string            `json:"name"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Volumes is VolumesShare or VolumesCopy, required when the sandbox
	// mounts volumes: sandboxes made from the snapshot mount the same
	// volumes, or copies of copies the snapshot takes.
	Volumes string `json:"volumes,omitempty"`
}

// CreateSnapshotWith is CreateSnapshot with options.
func (c *Client) CreateSnapshotWith(ctx context.Context, id string, o SnapshotOptions) (*Snapshot, error) {
	var s Snapshot
	if err := c.doJSON(ctx, "POST", sandboxPath(id, "snapshots"), nil, o, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Snapshots lists the snapshots by name.
func (c *Client) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var out []Snapshot
	if err := c.doJSON(ctx, "GET", "/v1/snapshots", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, name string) (*Snapshot, error) {
	var s Snapshot
	if err := c.doJSON(ctx, "GET", "/v1/snapshots/"+url.PathEscape(name), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot removes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.doJSON(ctx, "DELETE", "/v1/snapshots/"+url.PathEscape(name), nil, nil, nil)
}

// Fork makes count copies of sandbox id: with a memory runtime they
// continue its processes, otherwise they start fresh on a copy of its
// files.
func (c *Client) Fork(ctx context.Context, id string, count int) ([]Sandbox, error) {
	return c.ForkWith(ctx, id, ForkOptions{Count: count})
}

// ForkOptions tune ForkWith.
type ForkOptions struct {
	// Count is the number of copies.
	Count int `json:"count"`
	// Volumes is VolumesShare or VolumesCopy, required when the source
	// mounts volumes.
	Volumes string `json:"volumes,omitempty"`
}

// What a fork's copies get of the source's volumes (ForkOptions.Volumes).
const (
	// VolumesShare mounts the same volumes in every copy.
	VolumesShare = "share"
	// VolumesCopy gives every copy a copy-on-write copy of each volume,
	// named <volume>-<copy's ID>.
	VolumesCopy = "copy"
)

// ForkWith is Fork with options: for a source that mounts volumes, say
// whether the copies share them or get copies.
func (c *Client) ForkWith(ctx context.Context, id string, o ForkOptions) ([]Sandbox, error) {
	var out []Sandbox
	if err := c.doJSON(ctx, "POST", sandboxPath(id, "fork"), nil, o, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// TemplateFromSnapshot makes template name from a snapshot's files.
func (c *Client) TemplateFromSnapshot(ctx context.Context, name, snapshot string) (*Template, error) {
	var t Template
	if err := c.doJSON(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/from-snapshot", nil, map[string]string{"snapshot": snapshot}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
