// Package btrfs is the preferred storage backend: a template is a
// read-only btrfs subvolume, a sandbox root is an overlayfs mount with the
// template as its lower layer and its upper layer in a subvolume of its
// own, and a disk limit is a qgroup limit on that subvolume.
//
// Roots are overlays over the template rather than writable snapshots of
// it because the files of a snapshot are inodes of their own: every
// sandbox would read and cache its own copy of the same binaries, whereas
// through overlayfs every root reads the template's inodes and all
// sandboxes share one page cache copy. What the sandbox writes still lands
// in a subvolume, which keeps the qgroup limit exact, and copy-up clones
// the template's extents instead of copying data, because both layers are
// on one btrfs filesystem.
//
// Overlayfs reports the layers' real inode numbers when all of them are on
// one filesystem, but btrfs numbers inodes per subvolume, so a fresh
// upper subvolume would hand out the numbers the template already uses:
// two different files in one root would share st_dev and st_ino (the
// root directory itself and the template's first directory, for one),
// which breaks cp ("are the same file"), find (loop detection) and hard
// link detection. So a root's subvolume is a snapshot of the seed, a tiny
// subvolume holding one empty file whose inode number is above every
// template's, and new inodes in the root are numbered above it.
// CreateTemplate raises the seed's floor when a template needs it. A
// snapshot costs a transaction commit, and an empty subvolume would be
// committed all the same when DeleteRoot unmounts the overlay (which
// syncs the upper filesystem), so the snapshot is taken ahead of time:
// the backend keeps a few spare snapshots of the seed (spares.go) and
// CreateRoot renames one into place.
//
// The backend works on a btrfs filesystem: the state directory itself when
// it is on btrfs, or else a sparse image file under it, mounted through a
// loop device. Snapshots, deletes and limits go straight to the kernel
// through ioctls (no btrfs CLI on any hot path); mkfs.btrfs runs once, when
// the image is created.
//
// Layout under the btrfs tree (Dir, or Dir/mnt for the image):
//
//	templates/<name>          read-only subvolume: the lower layer
//	templates/.tmp-<name>-<x> template being filled; removed at startup
//	templates/.deleted-<sid>  deleted template that roots still use (<sid>: subvolume ID)
//	seed/floor                empty file numbered above every template inode
//	spares/<floor>-<x>        snapshot of seed, ready to become a root
//	roots/<id>                snapshot of seed: the root's subvolume, with the disk limit
//	roots/<id>/upper, work    overlayfs upper and work dirs
//	roots/<id>/lower          subvolume ID of the template in use
//
// and, outside the btrfs mount so that Close can unmount it while roots
// are mounted, Dir/merged/<id>: the overlay mount, the root's path. The
// overlay mount and the keeping of deleted templates are shared with the
// overlay backend (package ovl).
//
// The package does not know about sandboxes, drivers or the store.
package btrfs
