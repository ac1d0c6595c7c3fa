package e2b

import "github.com/corralrun/corral/internal/sandbox"

// Volume is a named volume as the Manager describes it.
type Volume = sandbox.Volume

// VolumeOptions creates a volume.
type VolumeOptions = sandbox.VolumeOptions

// volumeMount is the mount of volume name at target, read-write: E2B's
// volume mounts have no mode.
func volumeMount(name, target string) sandbox.Mount {
	return sandbox.Mount{Volume: name, Target: target, Mode: sandbox.MountReadWrite}
}

// mountedVolume is the volume m mounts, or "" for a host directory.
func mountedVolume(m sandbox.Mount) string { return m.Volume }
