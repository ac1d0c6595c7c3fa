package server

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/image"
	"github.com/corralrun/corral/internal/images"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// PullRequest is the body of POST /v1/templates/{name}/pull.
type PullRequest struct {
	// Ref is the image reference, e.g. "python:3.12".
	Ref string `json:"ref"`
	// Platform picks an image of a multi-platform index ("linux/arm64");
	// empty means linux/amd64.
	Platform string `json:"platform,omitempty"`
	// Insecure allows plain HTTP to the registry.
	Insecure bool `json:"insecure,omitempty"`
}

// maxBuildFile bounds the Dockerfile part of a build request.
const maxBuildFile = 1 << 20

func (s *Server) imageService(w http.ResponseWriter, r *http.Request) *images.Service {
	if s.cfg.Images == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "this server does not make templates from images"))
	}
	return s.cfg.Images
}

// pullTemplate pulls an image into a new template and streams progress as
// NDJSON BuildEvents.
func (s *Server) pullTemplate(w http.ResponseWriter, r *http.Request) {
	svc := s.imageService(w, r)
	if svc == nil {
		return
	}
	var req PullRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Ref == "" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "ref (an image reference) is required"))
		return
	}
	name := r.PathValue("name")
	if err := svc.CheckName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	out := newEventStream(w, s.redactor(r))
	t, err := svc.Pull(r.Context(), name, images.PullOptions{
		Ref: req.Ref, Platform: req.Platform, Insecure: req.Insecure, Progress: out.progress, Log: out,
	})
	out.finish(r, t, err)
}

// importArchive makes a template from a root file system tarball or an
// image archive in the body (images.Service.Import).
func (s *Server) importArchive(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	t, err := s.cfg.Images.Import(r.Context(), name, r.Body, images.ImportOptions{Platform: r.URL.Query().Get("platform")})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

// isMultipart reports whether r carries a multipart/form-data body: a
// Dockerfile build rather than a recipe.
func isMultipart(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "multipart/form-data"
}

// buildFromFile builds a template from a Dockerfile. The body is
// multipart/form-data: a "dockerfile" part first, then an optional
// "context" part holding a tar of the build context. Options are query
// parameters: build_arg=K=V (repeated), platform, insecure, and the
// network of RUN steps: network=none|allowlist|open and allow_domain
// (repeated; implies allowlist). It streams
// NDJSON BuildEvents: step lines and RUN output as "log", FROM pull
// progress as "progress", then "done" or "error".
func (s *Server) buildFromFile(w http.ResponseWriter, r *http.Request) {
	svc := s.imageService(w, r)
	if svc == nil {
		return
	}
	q := r.URL.Query()
	args := map[string]string{}
	for _, kv := range q["build_arg"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "build_arg %q must be NAME=value", kv))
			return
		}
		args[k] = v
	}
	insecure, err := boolParam(q, "insecure")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	network := egress.Policy{Mode: egress.Mode(q.Get("network"))}
	for _, d := range q["allow_domain"] {
		network.Domains = append(network.Domains, egress.DomainRule{Name: d})
	}
	mr, err := r.MultipartReader()
	if err != nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading multipart body: %v", err))
		return
	}
	part, err := mr.NextPart()
	if err != nil || part.FormName() != "dockerfile" {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "the first part of a build must be \"dockerfile\""))
		return
	}
	data, err := io.ReadAll(io.LimitReader(part, maxBuildFile+1))
	if err != nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading the dockerfile part: %v", err))
		return
	}
	if len(data) > maxBuildFile {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "the Dockerfile is larger than %d bytes", maxBuildFile))
		return
	}
	file, err := image.ParseBuildFile(bytes.NewReader(data))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	if err := svc.CheckName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	var buildContext io.Reader
	switch part, err := mr.NextPart(); {
	case errors.Is(err, io.EOF):
	case err != nil:
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading multipart body: %v", err))
		return
	case part.FormName() != "context":
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "unexpected part %q after the dockerfile (want \"context\")", part.FormName()))
		return
	default:
		buildContext = part
	}
	out := newEventStream(w, s.redactor(r))
	t, err := svc.Build(r.Context(), name, images.BuildOptions{
		File: file, Context: buildContext, Args: args, Platform: q.Get("platform"), Insecure: insecure,
		Out: out, Progress: out.progress, Network: network,
	})
	out.finish(r, t, err)
}

func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Errorf(errdefs.ErrInvalidArgument, "query parameter %s=%q is not a boolean", name, v)
	}
	return b, nil
}

// eventStream is an eventWriter whose status line waits for the first
// event, so that an operation failing before it has anything to report
// (a bad reference, a build file the planner refuses) gets an ordinary
// error response.
type eventStream struct {
	*eventWriter
	lazy   *lazyHeader
	redact func(error) error // what the client may see of an error
}

func newEventStream(w http.ResponseWriter, redact func(error) error) *eventStream {
	lazy := &lazyHeader{w: w}
	return &eventStream{eventWriter: &eventWriter{w: lazy, rc: http.NewResponseController(w)}, lazy: lazy, redact: redact}
}

func (e *eventStream) progress(p image.Progress) {
	e.send(BuildEvent{Type: "progress", Progress: &p})
}

// finish ends the stream with "done" or "error", or answers err as an
// ordinary error when nothing was sent yet. Called once the operation has
// returned, so no other goroutine sends any more.
func (e *eventStream) finish(r *http.Request, t sandbox.Template, err error) {
	e.flushLine()
	switch {
	case err != nil && !e.lazy.started:
		wire.WriteError(e.lazy.w, e.redact(err))
	case err != nil:
		if r.Context().Err() == nil {
			e.send(BuildEvent{Type: "error", Error: (*errorDetail)(errorOf(e.redact(err)))})
		}
	default:
		e.send(BuildEvent{Type: "done", Template: &t})
	}
}

// lazyHeader sends the NDJSON status line before the first write. Its
// writer serializes the writes.
type lazyHeader struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyHeader) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/x-ndjson")
		l.w.Header().Set("X-Content-Type-Options", "nosniff")
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(p)
}
