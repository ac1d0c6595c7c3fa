package corral

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/url"
	"time"
)

// Template is a root file system that sandboxes start from.
type Template struct {
	Name string `json:"name"`
	// Tenant owns the template; "" is the operator's, which every tenant
	// sees and uses. A tenant sees the operator's templates and its own,
	// and changes or deletes its own only.
	Tenant string `json:"tenant,omitempty"`
	// Source says how it was made: "import", "pull", "build" or a recipe
	// name.
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
	// Image and Digest name the image it came from (the reference
	// pulled, or the FROM of a build) and its manifest digest.
	Image  string `json:"image,omitempty"`
	Digest string `json:"digest,omitempty"`
	// BuildKeys are the build cache keys of the steps that made it.
	BuildKeys []string `json:"build_keys,omitempty"`
	// Defaults say how processes run in its sandboxes, from the image.
	Defaults *TemplateDefaults `json:"defaults,omitempty"`
	// Service, if set, starts in every new sandbox of the template.
	Service *Service `json:"service,omitempty"`
	// ReadySnapshots name its ready snapshots by runtime (CaptureReady).
	ReadySnapshots map[string]string `json:"ready_snapshots,omitempty"`
}

// Templates lists the templates the key sees, by name: the operator's and
// its tenant's own (all of them for an admin key).
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out []Template
	if err := c.doJSON(ctx, "GET", "/v1/templates", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Template returns one template by name; another tenant's is
// CodeNotFound.
func (c *Client) Template(ctx context.Context, name string) (*Template, error) {
	var t Template
	if err := c.doJSON(ctx, "GET", "/v1/templates/"+url.PathEscape(name), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ImportTemplate makes a template from a tar archive (plain or gzip): a
// root file system, or an image (an OCI image layout in a tar, or a
// `docker save` archive), told apart by the daemon from the archive's
// top-level names. An image's configuration becomes the template's
// Defaults. The template belongs to the key's tenant. Names are one
// namespace for all tenants: a name any tenant holds is
// CodeAlreadyExists.
func (c *Client) ImportTemplate(ctx context.Context, name string, tarball io.Reader) (*Template, error) {
	resp, err := c.do(ctx, "PUT", "/v1/templates/"+url.PathEscape(name), nil, tarball, "application/x-tar")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var t Template
	if err := decodeJSON(resp.Body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// BuildOptions choose a template recipe.
type BuildOptions struct {
	// Recipe is "debian" (a Debian userland for coding agents, built with
	// debootstrap) or "busybox" (tiny, for tests).
	Recipe         string `json:"recipe"`
	Mirror         string `json:"mirror,omitempty"`
	BuildEssential bool   `json:"build_essential,omitempty"`
	// Service, if set, is the template's service.
	Service *Service `json:"service,omitempty"`
}

// BuildTemplate builds a template on the daemon, copying its log lines to
// progress (if not nil) as they arrive.
func (c *Client) BuildTemplate(ctx context.Context, name string, opts BuildOptions, progress io.Writer) (*Template, error) {
	b, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/build", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readBuildStream(resp.Body, StreamOptions{Log: progress})
}

// DeleteTemplate removes a template no sandbox uses. A tenant's key
// deletes its tenant's templates only: the operator's are
// CodePermissionDenied, another tenant's CodeNotFound.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.doJSON(ctx, "DELETE", "/v1/templates/"+url.PathEscape(name), nil, nil, nil)
}

// Runtime describes an isolation runtime the daemon offers.
type Runtime struct {
	Name         string `json:"name"`
	Default      bool   `json:"default"`
	Capabilities struct {
		Pause      bool   `json:"pause"`
		Checkpoint bool   `json:"checkpoint"`
		Isolation  string `json:"isolation"`
		// Accel, for the vm runtime, is "kvm" or "tcg" (software
		// emulation, many times slower).
		Accel string `json:"accel,omitempty"`
		// PrivateDisk: the runtime's sandboxes write to a disk of their
		// own, so filesystem snapshots, forks and stops are refused
		// with CodeNotImplemented.
		PrivateDisk bool `json:"private_disk,omitempty"`
	} `json:"capabilities"`
	// Snapshot is what snapshots and forks of the runtime's sandboxes
	// hold: SnapshotMemory, SnapshotFilesystem, or "" when none.
	Snapshot string `json:"snapshot,omitempty"`
}

// Version describes the daemon.
type Version struct {
	Version  string    `json:"version"`
	Storage  string    `json:"storage"`
	Runtimes []Runtime `json:"runtimes"`
}

// Version asks the daemon what it is and offers.
func (c *Client) Version(ctx context.Context) (*Version, error) {
	var v Version
	if err := c.doJSON(ctx, "GET", "/v1/version", nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Health is the daemon's own account of whether it keeps its promises.
type Health struct {
	// OK is false while something the daemon promises is not kept;
	// Problems says what.
	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"`
	// DiskQuota is the state of disk limit accounting, for storage that
	// enforces disk limits.
	DiskQuota *DiskQuota `json:"disk_quota,omitempty"`
}

// DiskQuota is the state of disk limit accounting. While Enabled and not
// Consistent, disk limits are not enforced and creates that ask for one
// are refused as unavailable.
type DiskQuota struct {
	Enabled bool `json:"enabled"`
	// Mode is "simple" or "full".
	Mode       string `json:"mode,omitempty"`
	Consistent bool   `json:"consistent"`
	// Repairing is true while a rescan is under way.
	Repairing bool `json:"repairing,omitempty"`
	// Inconsistencies counts the times accounting was found inconsistent
	// since the daemon started.
	Inconsistencies int64 `json:"inconsistencies"`
	// Releasing counts deleted sandboxes whose disk accounting the
	// kernel has not given back yet.
	Releasing int `json:"releasing"`
}

// Health asks the daemon whether it keeps its promises. An answer with OK
// false is not an error: the daemon still serves requests.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.doJSON(ctx, "GET", "/v1/health", nil, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}
