// Package storage owns template trees and the copy-on-write roots that
// sandboxes run on.
//
// A template is a read-only tree. A sandbox root is a writable copy-on-write
// view of one template that only that sandbox sees. Both backends make a
// root an overlayfs mount with the template as its lower layer, so that
// all roots of a template share its page cache: btrfs (template =
// read-only subvolume, the root's writes in a subvolume of their own,
// disk quota = qgroup limit on it) and overlay (template = plain tree,
// no disk quota). The package does not know about sandboxes' state or
// drivers; the Manager decides when roots are made and removed.
package storage

import (
	"context"
	"os"
)

// Backend stores templates and sandbox roots. Implementations are safe for
// concurrent use for distinct names and IDs.
type Backend interface {
	// Name is "btrfs" or "overlay".
	Name() string

	// CreateTemplate makes a new template: it calls fill with the path of
	// a fresh empty writable directory, and when fill returns nil, seals
	// the tree read-only and makes it visible under name. If fill or
	// sealing fails, nothing is left behind. A name that exists returns an
	// error wrapping errdefs.ErrAlreadyExists.
	CreateTemplate(ctx context.Context, name string, fill func(dir string) error) error
	// DeleteTemplate removes a template. Roots made from it keep working.
	// Unknown names return an error wrapping errdefs.ErrNotFound.
	DeleteTemplate(ctx context.Context, name string) error
	// Templates lists the names of the complete templates.
	Templates(ctx context.Context) ([]string, error)
	// TemplatePath is the host path of a template's read-only tree.
	TemplatePath(name string) string

	// CreateRoot makes a writable copy-on-write root for sandbox id from
	// template and returns its host path. DiskBytes > 0 asks for a disk
	// limit; a backend that cannot enforce one returns an error wrapping
	// errdefs.ErrNotImplemented rather than ignoring it. A failed
	// CreateRoot leaves nothing behind.
	CreateRoot(ctx context.Context, id, template string, opts RootOptions) (string, error)
	// DeleteRoot removes a root and everything under it. Idempotent.
	DeleteRoot(ctx context.Context, id string) error
	// Roots lists the IDs of all roots, including half-made ones.
	Roots(ctx context.Context) ([]string, error)
	// RootPath is the host path of a root (whether or not it exists).
	RootPath(id string) string

	// Close releases backend-wide resources (for btrfs on a loop image:
	// unmounts it and frees the loop device). Roots in use must be
	// deleted first, or must survive as the backend documents.
	Close() error
}

// RootOptions tune one sandbox root.
type RootOptions struct {
	// DiskBytes limits the bytes the sandbox can write; 0 is no limit.
	DiskBytes int64
	// IDMap, when not nil, is an open user namespace (an nsfs file) whose
	// mapping the root shows its files through: each layer is an
	// ID-mapped mount of it, so the files keep their stored owners on
	// disk (driver.StoredIDBase+i), the root shows them as the namespace
	// maps them, and a write through the root lands with the stored owner
	// again. The mapping must cover the stored range and map 0 to 0. Nil
	// shows the stored owners as they are. The caller keeps and closes
	// the file; the mounted root does not need it.
	IDMap *os.File
}

// Changes is a Backend that keeps each root's writes apart from its
// template, so that they can be saved and replayed on a fresh root of the
// same template (snapshots, forks).
type Changes interface {
	// ChangesPath is the host path of the tree holding root id's changes
	// in overlayfs upper-layer form: changed and new files, whiteouts
	// (0/0 character devices) for removed ones, and opaque directories
	// (xattr trusted.overlay.opaque="y") for replaced ones. It must only
	// be read while the sandbox cannot write.
	ChangesPath(id string) string
}

// QuotaReporter is a Backend that enforces disk limits with accounting
// that can go wrong, and says whether it is right now.
type QuotaReporter interface {
	// QuotaStatus reads the state of disk quota accounting. It is cheap
	// (a few small reads) and safe to call at any time.
	QuotaStatus() QuotaStatus
}

// QuotaStatus is the state of a backend's disk quota accounting. While
// Enabled and not Consistent, disk limits are not enforced: the backend
// refuses roots with a limit (errdefs.ErrUnavailable) and repairs the
// accounting where it can.
type QuotaStatus struct {
	// Enabled is true once a root has asked for a limit.
	Enabled bool `json:"enabled"`
	// Mode is how bytes are counted: "simple" (each extent charged to
	// the subvolume that wrote it) or "full" (exact sharing, repaired by
	// rescans); empty when not Enabled.
	Mode string `json:"mode,omitempty"`
	// Consistent is false while the accounting cannot be trusted.
	Consistent bool `json:"consistent"`
	// Repairing is true while a rescan is under way.
	Repairing bool `json:"repairing,omitempty"`
	// Inconsistencies counts the times the accounting was found
	// inconsistent since the backend was opened.
	Inconsistencies int64 `json:"inconsistencies"`
	// Releasing counts deleted roots whose accounting the kernel has not
	// given back yet; their qgroups go once it has.
	Releasing int `json:"releasing"`
}

// Volumes is a Backend that also keeps named volumes: writable trees that
// belong to no sandbox, outlive the sandboxes that mount them and can be
// mounted by several at once. Names follow the rules of template names.
// Implementations are safe for concurrent use for distinct names.
type Volumes interface {
	// CreateVolume makes an empty volume and returns its host path. Its
	// top directory is owned by opts.UID:opts.GID, mode 0755.
	// opts.SizeBytes > 0 asks for a limit on the bytes written into it: a
	// backend that cannot enforce one returns an error wrapping
	// errdefs.ErrNotImplemented. An existing name returns an error
	// wrapping errdefs.ErrAlreadyExists. A failed create leaves nothing.
	CreateVolume(ctx context.Context, name string, opts VolumeOptions) (string, error)
	// CopyVolume makes volume dst a copy of volume src, which must not be
	// written meanwhile, with src's size limit; backends that can make it
	// copy-on-write (a snapshot, reflinks). A missing src returns an
	// error wrapping errdefs.ErrNotFound.
	CopyVolume(ctx context.Context, src, dst string) (string, error)
	// DeleteVolume removes a volume and everything in it. Idempotent.
	DeleteVolume(ctx context.Context, name string) error
	// Volumes lists the names of the volumes, sorted.
	Volumes(ctx context.Context) ([]string, error)
	// VolumePath is the host path of a volume (whether or not it exists).
	VolumePath(name string) string
	// VolumeUsage returns the bytes a volume takes, as well as the backend
	// can tell cheaply: its quota accounting where it has one, otherwise
	// a walk of the tree.
	VolumeUsage(ctx context.Context, name string) (int64, error)
}

// VolumeOptions tune one volume.
type VolumeOptions struct {
	// SizeBytes limits the bytes written into the volume; 0 is no limit.
	SizeBytes int64
	// UID and GID own the volume's top directory.
	UID, GID uint32
}
