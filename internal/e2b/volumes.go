package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"io/fs"
	"net/http"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// This file maps E2B's volumes (E2B's /volumes API and volumeMounts on
// create) onto Corral's named volumes. An E2B volume is a Corral volume:
// its volumeID and its name are both the Corral volume's name, which is
// unique and is what a sandbox's volumeMounts names, so Volume.connect,
// getInfo and destroy by ID and a mount by name address the same volume,
// and volumes made with `corral volume create` are E2B volumes too.

// VolumeManager is the Manager's named-volume API (sandbox.Manager has
// it): volumes by name, and their files without a sandbox. Paths are
// absolute inside the volume; nothing outside it is reachable.
type VolumeManager interface {
	CreateVolume(ctx context.Context, o VolumeOptions) (Volume, error)
	Volume(ctx context.Context, name string) (Volume, error)
	Volumes(ctx context.Context) ([]Volume, error)
	DeleteVolume(ctx context.Context, name string) error
	VolumeStat(ctx context.Context, name, path string) (wire.FileInfo, error)
	VolumeList(ctx context.Context, name, path string) ([]wire.FileInfo, error)
	VolumeReadFile(ctx context.Context, name, path string) (io.ReadCloser, int64, error)
	VolumeWriteFile(ctx context.Context, name, path string, r io.Reader, mode fs.FileMode) error
	VolumeMkdir(ctx context.Context, name, path string, parents bool, mode fs.FileMode) error
	VolumeRemove(ctx context.Context, name, path string) error
}

// The Manager is the VolumeManager of every daemon: volumeManagerOf's
// type assertion must hold for it.
var _ VolumeManager = (*sandbox.Manager)(nil)

// volumeManagerOf is cfg's VolumeManager: Config.Volumes, else the
// Manager when it has the volume API, else nil (no volumes).
func volumeManagerOf(cfg Config) VolumeManager {
	if cfg.Volumes != nil {
		return cfg.Volumes
	}
	if v, ok := any(cfg.Manager).(VolumeManager); ok && cfg.Manager != nil {
		return v
	}
	return nil
}

// volumeInfo is E2B's Volume (list) and, with a token, VolumeAndToken
// (create, get). No domain is returned: the SDK then sends volume content
// requests to E2B_VOLUME_API_URL, or to api.<E2B_DOMAIN>.
type volumeInfo struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
}

func (s *Server) volumeInfo(v Volume, token bool) volumeInfo {
	out := volumeInfo{VolumeID: v.Name, Name: v.Name}
	if token {
		out.Token = s.volumeToken(v.Name)
	}
	return out
}

// volumeToken is the bearer token of volume name's content API: an HMAC
// of the name under the API key, like the envd access tokens, so it needs
// no storage and changes when the key does. A volume deleted and created
// again under the same name has the same token.
func (s *Server) volumeToken(name string) string {
	mac := hmac.New(sha256.New, []byte(s.cfg.APIKey))
	mac.Write([]byte("corral-e2b-volume-token\x00" + name))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func (s *Server) routeVolumes() {
	s.handle("GET /volumes", s.withVolumes(s.listVolumes))
	s.handle("POST /volumes", s.withVolumes(s.createVolume))
	s.handle("GET /volumes/{volumeID}", s.withVolumes(s.getVolume))
	s.handle("DELETE /volumes/{volumeID}", s.withVolumes(s.destroyVolume))
}

// withVolumes answers 501 for a Server without volumes.
func (s *Server) withVolumes(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.vols == nil {
			s.writeAPIError(w, r, errNoVolumes())
			return
		}
		h(w, r)
	}
}

func errNoVolumes() error {
	return errdefs.Errorf(errdefs.ErrNotImplemented, "volumes are not supported by this Corral daemon")
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, err := s.vols.Volumes(r.Context())
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	out := make([]volumeInfo, 0, len(vs))
	for _, v := range vs {
		out = append(out, s.volumeInfo(v, false))
	}
	writeJSON(w, http.StatusOK, out)
}

// createVolume is POST /volumes {"name"}: a Corral volume of that name,
// without a size limit. Corral's name rules apply (invalid_argument, 400);
// a name in use is already_exists (409).
func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if req.Name == "" {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "name is required: name the volume"))
		return
	}
	v, err := s.vols.CreateVolume(r.Context(), VolumeOptions{Name: req.Name})
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b volume created", "volume", v.Name)
	writeJSON(w, http.StatusCreated, s.volumeInfo(v, true))
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.vols.Volume(r.Context(), r.PathValue("volumeID"))
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.volumeInfo(v, true))
}

// destroyVolume is DELETE /volumes/{volumeID}. A volume that a sandbox
// mounts is not deleted: failed_precondition, 409, whose message names
// the sandboxes.
func (s *Server) destroyVolume(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("volumeID")
	if err := s.vols.DeleteVolume(r.Context(), name); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.log.Info("e2b volume destroyed", "volume", name)
	w.WriteHeader(http.StatusNoContent)
}

// volumeMountInfo is E2B's SandboxVolumeMount.
type volumeMountInfo struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// mounts maps a create's volumeMounts onto sandbox mounts, read-write at
// each path; the Manager checks the names and targets.
func (n newSandbox) mounts(haveVolumes bool) ([]sandbox.Mount, error) {
	if len(n.VolumeMounts) == 0 {
		return nil, nil
	}
	if !haveVolumes {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "volumeMounts are not supported by this Corral daemon: it has no volumes")
	}
	out := make([]sandbox.Mount, 0, len(n.VolumeMounts))
	for _, vm := range n.VolumeMounts {
		if vm.Name == "" || vm.Path == "" {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "a volume mount names a volume (name) and a path in the sandbox (path): got %+v", vm)
		}
		out = append(out, volumeMount(vm.Name, vm.Path))
	}
	return out, nil
}

// volumeMountsOf lists the volumes among ms as E2B's volumeMounts; host
// directories mounted through Corral's own API are not E2B volumes and are
// left out.
func volumeMountsOf(ms []sandbox.Mount) []volumeMountInfo {
	out := []volumeMountInfo{}
	for _, m := range ms {
		if name := mountedVolume(m); name != "" {
			out = append(out, volumeMountInfo{Name: name, Path: m.Target})
		}
	}
	return out
}
