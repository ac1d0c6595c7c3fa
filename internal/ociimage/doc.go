// Package ociimage turns OCI and Docker images into template trees, without a
// Docker daemon: it pulls them from registries (Cache.Pull), reads OCI
// image layouts and `docker save` archives (Cache.Load), applies their
// layers with whiteouts and path safety (Image.Unpack), and carries the
// image configuration over as Defaults (environment, working directory,
// user) for the template. It also builds trees from a Dockerfile subset
// (ParseBuildFile, Builder), caching every step's result by a content key
// so that an unchanged rebuild runs nothing.
//
// It owns two caches, each under a directory the caller chooses: Cache, a
// content-addressed store of image blobs verified on write and on read, and
// DirStepCache, the build step results. Both have a GC that keeps what the
// caller names.
//
// It does not create templates, run sandboxes or know about the daemon:
// Unpack and Builder.Export fill a directory that a storage backend hands
// out (sandbox.Manager.CreateTemplate's fill function), and RUN steps run
// through the Runner interface, which the daemon implements with a
// sandbox. Every write into a tree from outside input goes through an
// os.Root on that tree. It uses go-containerregistry for the registry
// protocol, credentials and archive formats, and nothing of it is global:
// no package-level mutable state, no goroutine outlives the call that
// started it.
package ociimage
