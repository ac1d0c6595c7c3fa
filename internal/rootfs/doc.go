// Package rootfs fills template trees: a tiny busybox rootfs for tests, a
// Debian rootfs built with debootstrap for coding agents, and rootfs
// tarballs imported with path safety. It writes into a directory that a
// storage backend hands it and knows nothing of how that tree is stored.
//
// Everything written into a tree from outside input (tarball entries, the
// files BuildDebian edits) goes through an os.Root on that tree, so a
// hostile archive or a symlink left by a package cannot reach the host.
//
// The test that really runs debootstrap from the network takes minutes and
// runs only with CORRAL_TEST_DEBOOTSTRAP=1 (and never under -short).
package rootfs
