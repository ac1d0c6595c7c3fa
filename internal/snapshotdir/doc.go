// Package snapshotdir owns the on-disk form of a sandbox snapshot: the
// changes a sandbox made to its template's files, optionally a memory
// image from a driver's checkpoint, and a manifest of SHA-256 checksums.
//
// A snapshot is written into a temporary directory, every file and
// directory is synced, the manifest is written and synced last, and only
// then is the directory renamed to its final name (and the parent synced).
// A crash at any point therefore leaves either a complete snapshot or a
// temporary directory that Clean removes; never a half snapshot under a
// final name. Verify recomputes every checksum before a snapshot is used.
//
// The changes are a tar stream of an overlayfs upper directory: whiteouts
// (0/0 character devices) and opaque directories (the
// trusted.overlay.opaque xattr) become tar entries that Apply replays on
// a fresh root of the same template through its overlay mount, so the
// package never writes into a mounted overlay's layers. Apply resolves
// every path inside the target root (os.Root): a snapshot holds a
// sandbox's files, which are not trusted.
//
// The package knows nothing of sandboxes, drivers or the store.
package snapshotdir
