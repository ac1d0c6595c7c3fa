package e2b

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/templates"
	"github.com/corralrun/corral/internal/untar"
)

// This file serves E2B's template-build API (the SDK's Template.build):
// POST /v3/templates names the template and returns a build, the SDK
// uploads the files of each COPY step to the URL that GET
// /templates/{id}/files/{hash} gives, POST
// /v2/templates/{id}/builds/{buildID} starts the build, and GET
// .../status?logsOffset=N reports it with the log lines after the first
// N. A build runs as a Corral build (templates.Service.Build): the same
// step cache, the same network policy (none), its output as log lines.

// TemplateBuilder builds Corral templates; *templates.Service is one.
type TemplateBuilder interface {
	Build(ctx context.Context, name string, opts templates.BuildOptions) (sandbox.Template, error)
}

// maxBuildLogLines bounds the log a build keeps; later lines are dropped
// with one line saying so.
const maxBuildLogLines = 10000

// build is one template build and what its status reports.
type build struct {
	id, name string   // buildID (the Corral template it makes) and E2B name
	tags     []string // the tags to point at it once it is ready

	mu      sync.Mutex
	status  string    // "waiting", "building", "ready" or "error"
	changed time.Time // when status last changed
	logs    []logEntry
	partial []byte // output after the last newline
	reason  *buildReason
	body    *buildBody // set when started
}

// logEntry is E2B's BuildLogEntry.
type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
}

// buildReason is E2B's BuildStatusReason.
type buildReason struct {
	Message string `json:"message"`
	Step    string `json:"step,omitempty"`
}

// maxLogLine bounds one log entry; a longer line is cut.
const maxLogLine = 4096

// Write makes each line of the build's output a log entry. Steps write
// their output in chunks that need not end lines: the rest of a line
// waits for its newline (or flush). A carriage return ends a line too,
// so that progress bars make a few entries, not one huge one.
func (b *build) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.partial = append(b.partial, p...)
	for {
		i := bytes.IndexAny(b.partial, "\r\n")
		if i < 0 {
			break
		}
		if i > 0 {
			b.logLocked("info", string(b.partial[:i]))
		}
		b.partial = b.partial[i+1:]
	}
	if len(b.partial) > maxLogLine {
		b.logLocked("info", string(b.partial))
		b.partial = nil
	}
	return len(p), nil
}

// flush logs what is left of the last line.
func (b *build) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.partial) > 0 {
		b.logLocked("info", string(b.partial))
		b.partial = nil
	}
}

// logLocked appends one entry. Called with mu.
func (b *build) logLocked(level, msg string) {
	if len(msg) > maxLogLine {
		msg = msg[:maxLogLine] + " [cut]"
	}
	switch {
	case len(b.logs) < maxBuildLogLines:
		b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg})
	case len(b.logs) == maxBuildLogLines:
		b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: "warn", Message: "further build output dropped"})
	}
}

// builds holds the builds of the daemon's lifetime by buildID.
type builds struct {
	mu sync.Mutex
	m  map[string]*build
}

func (bs *builds) get(id string) (*build, error) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b, ok := bs.m[id]
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "build %q not found", id)
	}
	return b, nil
}

func (s *Server) routeTemplateBuilds() {
	s.content.HandleFunc("PUT /templatefiles/{hash}", s.uploadFiles)
	s.handle("POST /v3/templates", s.admin(s.requestBuild))
	s.handle("GET /templates/{id}/files/{hash}", s.admin(s.fileUploadLink))
	s.handle("POST /v2/templates/{id}/builds/{build}", s.admin(s.startBuild))
	s.handle("GET /templates/{id}/builds/{build}/status", s.buildStatus)
	s.handle("POST /templates/tags", s.admin(s.assignTags))
	s.handle("DELETE /templates/tags", s.admin(s.removeTags))
	// GET /templates/{id}/tags, written so as not to overlap
	// GET /templates/aliases/{alias}.
	s.handle("GET /templates/{id}/{sub}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("sub") != "tags" {
			s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrNotImplemented, "managing templates through the E2B API is not supported: use `corral template`"))
			return
		}
		s.templateTags(w, r)
	})
}

// templatesOn refuses a template-build call when the daemon builds no
// templates for the facade.
func (s *Server) templatesOn() error {
	if s.cfg.Templates == nil || s.tags == nil {
		return errdefs.Errorf(errdefs.ErrNotImplemented, "building templates through the E2B API is not enabled on this daemon: use `corral template build`")
	}
	return nil
}

// tagsRequest is the body of the calls that name a template and tags:
// POST /v3/templates (name), POST /templates/tags (target), DELETE
// /templates/tags (name).
type tagsRequest struct {
	Name   string   `json:"name"`
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// readTags reads and checks a tagsRequest; it returns the name and tag
// that its template reference means. needTags refuses a call without
// tags.
func (s *Server) readTags(r *http.Request, needTags bool) (req tagsRequest, name, tag string, err error) {
	if err = s.templatesOn(); err != nil {
		return
	}
	if err = decodeBody(r, &req); err != nil {
		return
	}
	ref := req.Name
	if req.Target != "" {
		ref = req.Target
	}
	if name, tag, err = splitName(ref); err != nil {
		return
	}
	if needTags && len(req.Tags) == 0 {
		err = errdefs.Errorf(errdefs.ErrInvalidArgument, "no tags named")
	}
	for _, t := range req.Tags {
		if err == nil && !tagPattern.MatchString(t) {
			err = errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid tag %q: use lower-case letters, digits, '.', '_' and '-'", t)
		}
	}
	return
}

// requestBuild is POST /v3/templates: it names a build of "name[:tag]"
// and the extra tags to give it.
func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	req, name, tag, err := s.readTags(r, false)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	tags := append([]string{tag}, req.Tags...)
	b := s.newBuild(name, tags)
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": name, "buildID": b.id, "names": []string{name}, "aliases": []string{name},
		"tags": tags, "public": false,
	})
}

// newBuild registers a build of name whose ID, the Corral template it
// makes, is name itself while no template or build has it, else name
// with a random suffix.
func (s *Server) newBuild(name string, tags []string) *build {
	s.builds.mu.Lock()
	defer s.builds.mu.Unlock()
	s.builds.prune(time.Now())
	id := name
	for {
		_, taken := s.builds.m[id]
		if !taken && !s.tags.isOrphan(id) && !s.m.TemplateExists(id) {
			break
		}
		suffix := make([]byte, 4)
		_, _ = rand.Read(suffix)
		id = fmt.Sprintf("%.54s-%s", name, hex.EncodeToString(suffix))
	}
	b := &build{id: id, name: name, tags: tags, status: "waiting", changed: time.Now()}
	s.builds.m[id] = b
	return b
}

// buildRetention is how long the status of a finished build stays to be
// asked for; a build named but never started (its files may take long to
// upload) stays for waitRetention.
const (
	buildRetention = time.Hour
	waitRetention  = 24 * time.Hour
)

// prune forgets the builds that ended more than buildRetention before
// now, and those named more than waitRetention before now and never
// started. Called with mu.
func (bs *builds) prune(now time.Time) {
	for id, b := range bs.m {
		b.mu.Lock()
		keep := buildRetention
		if b.status == "waiting" {
			keep = waitRetention
		}
		old := b.status != "building" && now.Sub(b.changed) > keep
		b.mu.Unlock()
		if old {
			delete(bs.m, id)
		}
	}
}

// filesDir is where uploaded COPY sources are kept, one directory per
// files hash; staging holds uploads being extracted.
func (s *Server) filesDir() string   { return filepath.Join(s.cfg.BuildDir, "files") }
func (s *Server) stagingDir() string { return filepath.Join(s.cfg.BuildDir, "staging") }

func (s *Server) uploaded(hash string) bool {
	fi, err := os.Stat(filepath.Join(s.filesDir(), hash))
	return err == nil && fi.IsDir()
}

// uploadValidity is how long an upload URL stays good.
const uploadValidity = time.Hour

// uploadSignature signs an upload URL for hash, good until expires (Unix
// seconds), under the API key: the SDK's PUT carries no API key.
func (s *Server) uploadSignature(hash, expires string) string {
	mac := hmac.New(sha256.New, []byte(s.cfg.APIKey))
	mac.Write([]byte("corral-e2b-template-files\x00" + hash + "\x00" + expires))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// fileUploadLink is GET /templates/{id}/files/{hash}: whether the files
// of a COPY step are here, and where to PUT them if not.
func (s *Server) fileUploadLink(w http.ResponseWriter, r *http.Request) {
	hash := r.PathValue("hash")
	if err := s.templatesOn(); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if !filesHashPattern.MatchString(hash) {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "files hash %q is not a SHA-256 in hex", hash))
		return
	}
	if s.uploaded(hash) {
		// In use again: collectFiles counts from now.
		now := time.Now()
		_ = os.Chtimes(filepath.Join(s.filesDir(), hash), now, now)
		writeJSON(w, http.StatusCreated, map[string]any{"present": true})
		return
	}
	// Behind a TLS proxy (--e2b-domain) the SDK must PUT over https too.
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	exp := strconv.FormatInt(time.Now().Add(uploadValidity).Unix(), 10)
	url := fmt.Sprintf("%s://%s/templatefiles/%s?expires=%s&signature=%s", scheme, r.Host, hash, exp, s.uploadSignature(hash, exp))
	writeJSON(w, http.StatusCreated, map[string]any{"present": false, "url": url})
}

// uploadFiles is PUT /templatefiles/{hash}?signature=...: a tar (plain
// or gzip) of a COPY step's files, extracted into the files directory.
// A second upload of the same hash replaces nothing: the content is the
// same by its hash.
func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	hash, q := r.PathValue("hash"), r.URL.Query()
	exp, sig := q.Get("expires"), q.Get("signature")
	if err := s.templatesOn(); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	if !filesHashPattern.MatchString(hash) || !hmac.Equal([]byte(sig), []byte(s.uploadSignature(hash, exp))) {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated, "invalid upload URL: ask GET /templates/{id}/files/{hash} for one"))
		return
	}
	if t, err := strconv.ParseInt(exp, 10, 64); err != nil || time.Now().Unix() > t {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated, "the upload URL has expired: ask GET /templates/{id}/files/{hash} for a new one"))
		return
	}
	if err := s.extractUpload(r.Context(), r, hash); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) extractUpload(ctx context.Context, r *http.Request, hash string) error {
	if err := os.MkdirAll(s.stagingDir(), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(s.filesDir(), 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.stagingDir(), hash+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	max := s.cfg.MaxUploadBytes
	if err := untar.ExtractTarLimit(ctx, http.MaxBytesReader(nil, r.Body, max), tmp, max); err != nil {
		if errors.Is(err, untar.ErrTooLarge) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "the uploaded files are more than %d bytes unpacked", max)
		}
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "extracting the uploaded files: %v", err)
	}
	// The upload's time is when collectFiles counts from, whatever times
	// the tar gave the top directory.
	now := time.Now()
	if err := os.Chtimes(tmp, now, now); err != nil {
		return err
	}
	err = os.Rename(tmp, filepath.Join(s.filesDir(), hash))
	if errors.Is(err, fs.ErrExist) || (err != nil && s.uploaded(hash)) {
		return nil // a concurrent upload of the same files won
	}
	return err
}

// startBuild is POST /v2/templates/{id}/builds/{build}: it checks the
// steps and runs the build in the background.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	var body buildBody
	err := s.templatesOn()
	if err == nil {
		err = decodeBody(r, &body)
	}
	var b *build
	if err == nil {
		b, err = s.builds.start(r.PathValue("build"), r.PathValue("id"), &body)
	}
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	go s.runBuild(b, body)
	w.WriteHeader(http.StatusAccepted)
}

// start marks build id of name as building body. Under mu, so that prune
// cannot forget it meanwhile.
func (bs *builds) start(id, name string, body *buildBody) (*build, error) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b, ok := bs.m[id]
	if !ok || b.name != name {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "build %q of %q not found", id, name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.body != nil {
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "build %q was started already", id)
	}
	b.body, b.status, b.changed = body, "building", time.Now()
	return b, nil
}
