package sandbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
)

// What a fork does with the source's volumes (ForkOptions.Volumes).
const (
	// VolumesShare mounts the same volumes in every copy.
	VolumesShare = "share"
	// VolumesCopy gives every copy a copy-on-write copy of each volume,
	// named <volume>-<copy's ID>, taken while the source is frozen.
	VolumesCopy = "copy"
)

// ForkOptions tune a fork.
type ForkOptions struct {
	// Volumes is VolumesShare or VolumesCopy; a source that mounts
	// volumes needs one of them, as neither is the obvious default.
	Volumes string
}

// checkVolumeChoice refuses to fork or snapshot (what) sb with host
// directory mounts or cow mounts of volumes (a copy would miss what it
// changed through them: the cow layer is the sandbox's own), and with
// volumes unless volumes says what the copies get.
func checkVolumeChoice(sb Sandbox, volumes, what string) error {
	switch volumes {
	case "", VolumesShare, VolumesCopy:
	default:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "volumes %q: want share or copy", volumes)
	}
	some, all := volumeMounts(sb.Mounts)
	switch {
	case len(sb.Mounts) == 0:
		return nil
	case !all:
		return refuseMounted(sb, what)
	case slices.ContainsFunc(sb.Mounts, func(mt Mount) bool { return mt.Mode == MountCopyOnWrite }):
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s mounts a volume cow: its changes there are its own, so a %s would miss them; mount it rw or ro", sb.ID, what)
	case some && volumes == "":
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "sandbox %s mounts volumes: say whether a %s shares them or takes copies (volumes share or copy)", sb.ID, what)
	}
	return nil
}

// snapVolumes is what a snapshot keeps of its source's volume mounts:
// frozen, when set, takes the copies while the source is frozen.
type snapVolumes struct {
	mounts []Mount
	copied bool
	frozen func(context.Context) error
	made   []string // the copies made, which a failed snapshot deletes
	m      *Manager
}

// snapshotVolumes plans what snapshot spec of sb keeps of sb's volumes.
func (m *Manager) snapshotVolumes(sb Sandbox, spec SnapshotSpec) *snapVolumes {
	v := &snapVolumes{mounts: append([]Mount(nil), sb.Mounts...), m: m}
	if len(v.mounts) == 0 {
		v.mounts = nil
	}
	if spec.Volumes != VolumesCopy || len(sb.Mounts) == 0 {
		return v
	}
	v.copied = true
	v.frozen = func(ctx context.Context) error {
		for j, mt := range v.mounts {
			name := copyName(mt.Volume, spec.Name)
			if _, err := m.copyVolume(ctx, mt.Volume, name); err != nil {
				return err
			}
			v.made = append(v.made, name)
			v.mounts[j].Volume = name
		}
		return nil
	}
	return v
}

// dropOnError deletes the copies when *err is set.
func (v *snapVolumes) dropOnError(ctx context.Context, err *error) {
	if *err != nil {
		*err = errors.Join(*err, v.m.dropVolumes(ctx, v.made))
	}
}

// copyName is the name of the copy of volume vol for owner (a sandbox ID
// or a snapshot name): vol-owner, with vol cut to fit 63 characters. A cut
// name ends in a hash of the whole one, so that two volumes whose names
// share the part kept still get copies of their own.
func copyName(vol, owner string) string {
	if n := 63 - len(owner) - 1; len(vol) > n {
		h := fnv.New32a()
		h.Write([]byte(vol))
		sum := fmt.Sprintf("%08x", h.Sum32())
		vol = vol[:max(n-len(sum)-1, 1)] + "." + sum
	}
	return vol + "-" + owner
}

// mountedVolumes lists the volumes of ms.
func mountedVolumes(ms []Mount) []string {
	var out []string
	for _, mt := range ms {
		if mt.Volume != "" {
			out = append(out, mt.Volume)
		}
	}
	return out
}

// admitForks admits n copies of spec for ctx's caller, each with its own
// ID; nothing is acquired yet.
func (m *Manager) admitForks(ctx context.Context, spec Spec, n int) ([]Sandbox, driver.Driver, error) {
	out := make([]Sandbox, n)
	var drv driver.Driver
	for i := range out {
		sb, d, err := m.admit(ctx, spec)
		if err != nil {
			return nil, nil, err
		}
		sb.createdBy(ctx)
		out[i], drv = sb, d
	}
	return out, drv, nil
}

// copyForkVolumes gives each of sbs a copy of each volume it mounts,
// <volume>-<sandbox ID>, and points its mounts at them. It returns the
// copies it made, which the caller deletes if the fork fails; on its own
// failure it deletes them itself.
func (m *Manager) copyForkVolumes(ctx context.Context, sbs []Sandbox) (copies []string, err error) {
	defer func() {
		if err != nil {
			err = errors.Join(err, m.dropVolumes(ctx, copies))
			copies = nil
		}
	}()
	for i := range sbs {
		ms := make([]Mount, len(sbs[i].Mounts))
		copy(ms, sbs[i].Mounts)
		for j, mt := range ms {
			name := copyName(mt.Volume, sbs[i].ID)
			if _, err := m.copyVolume(ctx, mt.Volume, name); err != nil {
				return copies, err
			}
			copies = append(copies, name)
			ms[j].Volume = name
		}
		sbs[i].Mounts = ms
	}
	return copies, nil
}

// dropVolumes deletes the volumes a failed fork copied.
func (m *Manager) dropVolumes(ctx context.Context, names []string) error {
	var errs []error
	for _, n := range names {
		if err := m.DeleteVolume(context.WithoutCancel(ctx), n); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// createWithVolumeCopies creates spec, mounting a copy of each volume of
// ms (as copyForkVolumes names them) from src; a failure deletes the
// copies.
func (m *Manager) createWithVolumeCopies(ctx context.Context, spec Spec, ms []Mount, src *restoreSource) (_ Sandbox, err error) {
	spec.Mounts = ms
	sbs, drv, err := m.admitForks(ctx, spec, 1)
	if err != nil {
		return Sandbox{}, err
	}
	copies, err := m.copyForkVolumes(ctx, sbs)
	if err != nil {
		return Sandbox{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.dropVolumes(ctx, copies))
		}
	}()
	return m.create(ctx, sbs[0], drv, src, nil)
}
