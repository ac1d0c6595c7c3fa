// Package untar writes the entries of a tar stream into a directory tree
// through an os.Root, so that no entry can create, change or remove anything
// outside the tree, whatever its name, the symlinks and hard links before
// it, or what the tree already held. It owns the rules both of Corral's
// archive importers share: name cleaning, replacing what is already there,
// ownership, modes (setuid, setgid, sticky included), times, directory
// modes applied after their contents, refusing sparse files, and errors
// that wrap errdefs.ErrInvalidArgument when the archive is at fault. The
// agent's plain file writes set modes with the same SetFileMode.
//
// It does not read the stream, decompress it or know about image layers:
// callers (ExtractTar, internal/ociimage's layer applier)
// loop over tar.Reader themselves and add their own rules, such as OCI
// whiteouts, before handing an entry to a Writer.
package untar
