// Package mounts makes the host side of the host directories that
// sandboxes mount (sandbox.Mounter): it decides which sources may be
// mounted, and prepares each one as a mount of its own under the daemon's
// run directory, which a driver then binds into the sandbox.
//
// A source is mounted only from beneath a root the operator allows
// (`corral server --allow-mount DIR`). It is opened from that root with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), so no symlink and no ".."
// can lead out of it, and the directory opened is the one that is cloned
// (open_tree), so a rename after the check cannot swap another directory
// in. The clone is changed before it is attached anywhere:
//
//   - every mode: ID-mapped so that the directory's owner is the
//     sandbox's default user (root, or its template's user), which runs
//     as another host user in a user namespace, and the sandbox's root
//     writes as the stored root when it is not that user (a read-only
//     clone of a file system that cannot be mapped is mounted unmapped);
//   - ro: read-only, set-user-ID bits and device files ignored, for every
//     mount beneath it too;
//   - rw: what the sandbox writes keeps the directory owner's IDs on the
//     host;
//   - cow: the mapped clone made read-only is the lower layer of an
//     overlay whose upper layer is the sandbox's own, in its root's disk
//     accounting when the storage can say where, otherwise under the state
//     directory: the host directory is never written. The layer is used
//     through an ID-mapped clone that keeps its files in the stored range,
//     so that a sandbox that starts again in another range still owns
//     what it changed.
//
// Everything of sandbox ID lives under <RunDir>/<ID> (mounts) and
// <StateDir>/<ID> (copy-on-write layers, or symlinks to them where the
// storage keeps them inside the sandbox root's disk accounting,
// sandbox.MountOptions.LayerDir); Release and Sweep remove them, Detach
// (a stopped sandbox's) removes the mounts and keeps the layers for the
// next Prepare.
// It does not know drivers or records: the Manager says which sandboxes
// exist.
package mounts
