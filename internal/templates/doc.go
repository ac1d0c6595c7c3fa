// Package templates makes templates from OCI and Docker images for the
// daemon. It pulls images from registries, loads image archives and builds
// Dockerfiles with package ociimage, fills new templates with the results
// through the sandbox Manager (which records them with the image's
// defaults), and runs the RUN steps of builds in transient sandboxes
// (Manager.RunOnTree). It owns the daemon's image cache and build cache and
// collects their garbage: blobs and step results that no template needs.
//
// It does not speak HTTP (package server does), store templates (the
// Manager and its storage backend do), or parse images and build files
// (package ociimage does). Its only goroutine is the garbage collector's,
// which Close stops.
package templates
