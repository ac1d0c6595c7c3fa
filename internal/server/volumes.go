package server

import (
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// VolumeRequest is the body of POST /v1/volumes. SizeBytes 0 is no
// limit; a limit needs the btrfs storage backend.
type VolumeRequest struct {
	Name      string            `json:"name"`
	SizeBytes int64             `json:"size_bytes,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// Volumes are shown as the Manager keeps them (sandbox.Volume): nothing
// in one is secret.

func (s *Server) volumeRoutes() []route {
	return []route{
		{"POST /v1/volumes", s.createVolume},
		{"GET /v1/volumes", s.listVolumes},
		{"GET /v1/volumes/{name}", s.getVolume},
		{"DELETE /v1/volumes/{name}", s.deleteVolume},
		{"GET /v1/volumes/{name}/files", s.volumeReadFile},
		{"PUT /v1/volumes/{name}/files", s.volumeWriteFile},
		{"DELETE /v1/volumes/{name}/files", s.volumeRemove},
		{"GET /v1/volumes/{name}/files/stat", s.volumeStat},
		{"GET /v1/volumes/{name}/files/list", s.volumeList},
		{"POST /v1/volumes/{name}/files/mkdir", s.volumeMkdir},
	}
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req VolumeRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := s.m.CreateVolume(r.Context(), sandbox.VolumeOptions{Name: req.Name, SizeBytes: req.SizeBytes, Labels: req.Labels})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, err := s.m.Volumes(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, vs)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.m.Volume(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteVolume(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeFiles runs op on the volume of the request's path and the
// required path query parameter, and writes its JSON answer, or its error;
// op returns nil when it wrote the response itself.
func (s *Server) volumeFiles(w http.ResponseWriter, r *http.Request, op func(name, p string) (any, error)) {
	p := r.URL.Query().Get("path")
	if p == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameter path is required"))
		return
	}
	out, err := op(r.PathValue("name"), p)
	switch {
	case err != nil:
		s.writeError(w, r, err)
	case out != nil:
		writeJSON(w, http.StatusOK, out)
	}
}

func (s *Server) volumeReadFile(w http.ResponseWriter, r *http.Request) {
	s.volumeFiles(w, r, func(name, p string) (any, error) {
		body, size, err := s.m.VolumeReadFile(r.Context(), name, p)
		if err != nil {
			return nil, err
		}
		defer body.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, body); err != nil {
			panic(http.ErrAbortHandler) // cut short: never looks complete
		}
		return nil, nil
	})
}

func (s *Server) volumeWriteFile(w http.ResponseWriter, r *http.Request) {
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || sandbox.RangeFileMode.Check(int64(v)) != nil {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "mode %q must be octal permission bits like 0644", m))
			return
		}
		mode = fileMode(uint32(v))
	}
	s.volumeFiles(w, r, func(name, p string) (any, error) {
		if err := s.m.VolumeWriteFile(r.Context(), name, p, r.Body, mode); err != nil {
			return nil, err
		}
		return s.m.VolumeStat(r.Context(), name, p)
	})
}

func (s *Server) volumeRemove(w http.ResponseWriter, r *http.Request) {
	s.volumeFiles(w, r, func(name, p string) (any, error) {
		if err := s.m.VolumeRemove(r.Context(), name, p); err != nil {
			return nil, err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil, nil
	})
}

func (s *Server) volumeStat(w http.ResponseWriter, r *http.Request) {
	s.volumeFiles(w, r, func(name, p string) (any, error) { return s.m.VolumeStat(r.Context(), name, p) })
}

func (s *Server) volumeList(w http.ResponseWriter, r *http.Request) {
	s.volumeFiles(w, r, func(name, p string) (any, error) {
		list, err := s.m.VolumeList(r.Context(), name, p)
		if list == nil && err == nil {
			list = []wire.FileInfo{}
		}
		return list, err
	})
}

func (s *Server) volumeMkdir(w http.ResponseWriter, r *http.Request) {
	var req wire.MkdirRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Path == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "path is required"))
		return
	}
	if err := sandbox.RangeFileMode.Check(int64(req.Mode)); err != nil {
		s.writeError(w, r, err)
		return
	}
	mode := os.FileMode(0o755)
	if req.Mode != 0 {
		mode = fileMode(req.Mode)
	}
	name := r.PathValue("name")
	if err := s.m.VolumeMkdir(r.Context(), name, req.Path, req.Parents, mode); err != nil {
		s.writeError(w, r, err)
		return
	}
	fi, err := s.m.VolumeStat(r.Context(), name, req.Path)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}
