package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/rootfs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/templates"
	"github.com/corralrun/corral/internal/untar"
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
	// Service, if set, is the template's service.
	Service *sandbox.Service `json:"service,omitempty"`
}

// maxBuildFile bounds the Dockerfile part of a build request.
const maxBuildFile = 1 << 20

func (s *Server) imageService(w http.ResponseWriter, r *http.Request) *templates.Service {
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
	if err := sandbox.ValidateService(req.Service); err != nil {
		s.writeError(w, r, err)
		return
	}
	out := newEventStream(w, s.redactor(r))
	t, err := svc.Pull(r.Context(), name, templates.PullOptions{
		Ref: req.Ref, Platform: req.Platform, Insecure: req.Insecure, Progress: out.progress, Log: out, Service: req.Service,
	})
	out.finish(r, t, err)
}

// importArchive makes a template from a root file system tarball or an
// image archive in the body (templates.Service.Import).
func (s *Server) importArchive(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	t, err := s.cfg.Images.Import(r.Context(), name, r.Body, templates.ImportOptions{Platform: r.URL.Query().Get("platform")})
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
// parameters: build_arg=K=V (repeated), platform, insecure, no_cache
// (run every step even when cached), and the
// network of RUN steps: network=none|allowlist|open and allow_domain
// (repeated; implies allowlist), and the template's service
// (serviceParams). It streams
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
	noCache, err := boolParam(q, "no_cache")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	force := 0
	if noCache {
		force = 1
	}
	service, noStart, err := serviceParams(q)
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
	file, err := ociimage.ParseBuildFile(bytes.NewReader(data))
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
	t, err := svc.Build(r.Context(), name, templates.BuildOptions{
		File: file, Context: buildContext, Args: args, Platform: q.Get("platform"), Insecure: insecure,
		Out: out, Progress: out.progress, Network: network, Service: service, NoStart: noStart, ForceFrom: force,
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

func (e *eventStream) progress(p ociimage.Progress) {
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

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.m.Templates(r.Context()))
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.m.Template(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// importTemplate makes a template from a rootfs tarball in the body, or
// from an image archive when the server has an image service.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Images != nil {
		s.importArchive(w, r)
		return
	}
	name := r.PathValue("name")
	t, err := s.m.CreateTemplate(r.Context(), name, "import", func(dir string) error {
		return untar.ExtractTar(r.Context(), r.Body, dir)
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteTemplate(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.cfg.Images != nil {
		s.cfg.Images.Collect()
	}
	w.WriteHeader(http.StatusNoContent)
}

// buildTemplate builds a template from a recipe and streams its log as
// NDJSON BuildEvents. Disconnecting cancels the build and removes what it
// made.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	if isMultipart(r) {
		s.buildFromFile(w, r)
		return
	}
	var req BuildRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	var fill func(ctx context.Context, dir string, progress io.Writer) error
	switch req.Recipe {
	case "busybox":
		fill = func(_ context.Context, dir string, _ io.Writer) error { return rootfs.FillBusybox(dir, "") }
	case "debian", "code-interpreter":
		opts := rootfs.DebianOptions{Mirror: req.Mirror, BuildEssential: req.BuildEssential}
		if req.Recipe == "code-interpreter" {
			opts.Extra, opts.Warm = rootfs.CodeInterpreterPackages, rootfs.CodeInterpreterWarm
			if req.Service == nil {
				req.Service = CodeInterpreterService()
			}
		}
		fill = func(ctx context.Context, dir string, progress io.Writer) error {
			return rootfs.BuildDebian(ctx, dir, opts, progress)
		}
	default:
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "unknown recipe %q (available: debian, code-interpreter, busybox)", req.Recipe))
		return
	}
	if err := sandbox.ValidateTemplateName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.m.TemplateExists(name) {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrAlreadyExists, "template %q already exists", name))
		return
	}
	if err := sandbox.ValidateService(req.Service); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := &eventWriter{w: w, rc: http.NewResponseController(w)}
	redact := s.redactor(r)
	t, err := s.m.CreateTemplateFrom(r.Context(), sandbox.Template{Name: name, Source: req.Recipe, Service: req.Service}, func(dir string) error {
		return fill(r.Context(), dir, out)
	})
	out.flushLine()
	if err != nil {
		out.send(BuildEvent{Type: "error", Error: (*errorDetail)(errorOf(redact(err)))})
		return
	}
	out.send(BuildEvent{Type: "done", Template: &t})
}

// eventWriter turns a build's log output into "log" events, one per line.
type eventWriter struct {
	mu   sync.Mutex
	w    io.Writer
	rc   *http.ResponseController
	line []byte
}

func (e *eventWriter) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.line = append(e.line, p...)
	for {
		i := bytes.IndexByte(e.line, '\n')
		if i < 0 {
			break
		}
		e.sendLocked(BuildEvent{Type: "log", Text: string(e.line[:i])})
		e.line = e.line[i+1:]
	}
	return len(p), nil
}

func (e *eventWriter) flushLine() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.line) > 0 {
		e.sendLocked(BuildEvent{Type: "log", Text: string(e.line)})
		e.line = nil
	}
}

func (e *eventWriter) send(ev BuildEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sendLocked(ev)
}

func (e *eventWriter) sendLocked(ev BuildEvent) {
	b, err := json.Marshal(ev)
	if err != nil {
		panic(fmt.Sprintf("encoding build event: %v", err))
	}
	_, _ = e.w.Write(append(b, '\n'))
	_ = e.rc.Flush()
}
