package storage

// LayerDirs is a Backend that can hold further copy-on-write layers of a
// sandbox (those of its cow mounts) where its root's disk limit counts
// them.
type LayerDirs interface {
	// LayerDir returns a directory private to the daemon inside root id's
	// accounting, made if missing; the sandbox does not see it, and it
	// goes with the root. A missing root is an error wrapping
	// errdefs.ErrNotFound.
	LayerDir(id string) (string, error)
}
