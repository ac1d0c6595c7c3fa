package e2b

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/templates"
	"github.com/corralrun/corral/internal/tenancy"
)

// runBuild runs build b of body to its end and records the outcome. A
// build the daemon's shutdown interrupts ends in error.
func (s *Server) runBuild(b *build, body buildBody) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	began := time.Now()
	err := s.buildTemplate(ctx, b, body)
	b.flush()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.changed = time.Now()
	if err != nil {
		b.status, b.reason = "error", &buildReason{Message: err.Error(), Step: failedStep(err)}
		b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: "error", Message: err.Error()})
		s.log.Info("E2B template build failed", "template", b.name, "build", b.id, "error", err)
		return
	}
	b.status = "ready"
	s.log.Info("E2B template built", "template", b.name, "build", b.id, "duration_ms", time.Since(began).Milliseconds())
}

// buildTemplate builds the Corral template b.id and points b's tags at
// it; the builds no tag points at any more are deleted where no sandbox
// uses them.
func (s *Server) buildTemplate(ctx context.Context, b *build, body buildBody) error {
	if body.FromTemplate != "" {
		// fromTemplate names an E2B template ("name[:tag]") or a Corral one.
		if _, _, err := splitName(body.FromTemplate); err != nil {
			return &stepError{step: "base", err: err}
		}
		body.FromTemplate = s.resolveTemplate(body.FromTemplate)
	}
	file, err := body.instructions(s.uploaded)
	if err != nil {
		return err
	}
	sv, err := body.service()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.filesDir(), 0o700); err != nil {
		return err
	}
	opts := templates.BuildOptions{File: file, ContextDir: s.filesDir(), Out: b, Service: sv, Network: s.cfg.BuildNetwork,
		ForceFrom: body.forceFrom()}
	if _, err := s.cfg.Templates.Build(ctx, b.id, opts); err != nil {
		return err
	}
	stale, err := s.tags.set(b.name, b.id, b.tags)
	if err != nil {
		return errors.Join(err, s.m.DeleteTemplate(context.WithoutCancel(ctx), b.id))
	}
	s.dropBuilds(ctx, stale)
	return nil
}

// dropBuilds deletes builds that no tag points at, with those an earlier
// call had to keep; one that a sandbox or snapshot still uses is kept
// for a later call (sweepOrphans). A kept build is deleted only while it
// is still the template it was (orphan) and untagged.
func (s *Server) dropBuilds(ctx context.Context, builds []string) {
	ctx = tenancy.AsDaemon(context.WithoutCancel(ctx)) // the daemon's bookkeeping
	todo := s.tags.takeOrphans()
	for _, id := range builds {
		if t, err := s.m.Template(ctx, id); err == nil {
			todo = append(todo, orphan{Build: id, CreatedAt: t.CreatedAt})
		}
	}
	var kept []orphan
	for _, o := range todo {
		t, err := s.m.Template(ctx, o.Build)
		if err != nil || !t.CreatedAt.Equal(o.CreatedAt) || len(s.tags.namesOf(o.Build)) > 0 {
			continue // gone, made anew, or tagged again
		}
		if err := s.m.DeleteTemplate(ctx, o.Build); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Debug("untagged template build kept for now", "build", o.Build, "reason", err)
			kept = append(kept, o)
		}
	}
	if err := s.tags.addOrphans(kept); err != nil {
		s.log.Warn("untagged template builds not recorded for a later delete", "builds", kept, "error", err)
	}
}

// orphanSweep is how often the builds that dropBuilds had to keep are
// tried again.
const orphanSweep = time.Minute

// sweepOrphans retries dropBuilds' kept builds until Close.
func (s *Server) sweepOrphans() {
	defer close(s.swept)
	t := time.NewTicker(orphanSweep)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case now := <-t.C:
			s.dropBuilds(context.Background(), nil)
			s.collectFiles(now)
		}
	}
}

// failedStep is the E2B step a build error names: "base" for the FROM,
// a step's number, "finalize" for the start and ready commands; "" when
// no step is at fault.
func failedStep(err error) string {
	var se *stepError
	if errors.As(err, &se) {
		return se.step
	}
	var le *ociimage.LineError
	if errors.As(err, &le) {
		if le.Line == 0 {
			return "base"
		}
		return strconv.Itoa(le.Line)
	}
	return ""
}

// buildStatus is GET /templates/{id}/builds/{build}/status: the state
// and the log entries after the first logsOffset.
func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	b, err := s.builds.get(r.PathValue("build"))
	if err == nil && b.name != r.PathValue("id") {
		err = errdefs.Errorf(errdefs.ErrNotFound, "build %q is not a build of %q", b.id, r.PathValue("id"))
	}
	offset := 0
	if v := r.URL.Query().Get("logsOffset"); err == nil && v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			err = errdefs.Errorf(errdefs.ErrInvalidArgument, "logsOffset %q: want a count of log entries", v)
		}
	}
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	b.mu.Lock()
	entries := []logEntry{}
	if offset < len(b.logs) {
		entries = slices.Clone(b.logs[offset:])
	}
	out := map[string]any{"templateID": b.name, "buildID": b.id, "status": b.status,
		"logEntries": entries, "logs": []string{}}
	if b.reason != nil {
		out["reason"] = *b.reason
	}
	b.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// assignTags is POST /templates/tags: tags pointed at the build that
// target ("name[:tag]") names.
func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	req, name, _, err := s.readTags(r, true)
	build, ok := "", false
	if err == nil {
		if build, ok = s.tags.resolve(req.Target); !ok {
			err = errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", req.Target)
		}
	}
	var stale []string
	if err == nil {
		stale, err = s.tags.set(name, build, req.Tags)
	}
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.dropBuilds(r.Context(), stale)
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": build, "tags": req.Tags})
}

// removeTags is DELETE /templates/tags: tags of a name dropped.
func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	req, name, _, err := s.readTags(r, true)
	var stale []string
	if err == nil {
		stale, err = s.tags.remove(name, req.Tags)
	}
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	s.dropBuilds(r.Context(), stale)
	w.WriteHeader(http.StatusNoContent)
}

// templateTags is GET /templates/{id}/tags.
func (s *Server) templateTags(w http.ResponseWriter, r *http.Request) {
	if err := s.templatesOn(); err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	name := r.PathValue("id")
	tags := s.tags.list(name)
	if len(tags) == 0 {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrNotFound, "template %q has no tags", name))
		return
	}
	type tagInfo struct {
		Tag       string    `json:"tag"`
		BuildID   string    `json:"buildID"`
		CreatedAt time.Time `json:"createdAt"`
	}
	out := []tagInfo{}
	for tag, ref := range tags {
		out = append(out, tagInfo{Tag: tag, BuildID: ref.Build, CreatedAt: ref.CreatedAt})
	}
	slices.SortFunc(out, func(a, b tagInfo) int { return a.CreatedAt.Compare(b.CreatedAt) })
	writeJSON(w, http.StatusOK, out)
}

// codeInterpreterAlias is the template @e2b/code-interpreter creates
// sandboxes from by default; without a tag or template of that name, it
// means Corral's code-interpreter template.
const codeInterpreterAlias, codeInterpreterTemplate = "code-interpreter-v1", "code-interpreter"

// resolveTemplate is the Corral template that an E2B template reference
// ("name[:tag]", or a Corral template's own name) means.
func (s *Server) resolveTemplate(ref string) string {
	if s.tags != nil {
		if b, ok := s.tags.resolve(ref); ok {
			return b
		}
	}
	if ref == codeInterpreterAlias {
		if !s.m.TemplateExists(ref) {
			return codeInterpreterTemplate
		}
	}
	return ref
}

// deleteTemplateBuilds deletes every build of the E2B name and drops
// the tags of those it deleted; a build that a sandbox or snapshot uses
// stays, with its tags, and the error says why. ok is false when name
// has no tags.
func (s *Server) deleteTemplateBuilds(ctx context.Context, name string) (ok bool, err error) {
	if s.tags == nil {
		return false, nil
	}
	tags := s.tags.list(name)
	if len(tags) == 0 {
		return false, nil
	}
	var gone, errs []error
	var dropped []string
	pointing := map[string]string{}
	deleted := map[string]bool{}
	for _, r := range tags {
		if _, done := deleted[r.Build]; done {
			continue
		}
		err := s.m.DeleteTemplate(ctx, r.Build)
		deleted[r.Build] = err == nil || errors.Is(err, errdefs.ErrNotFound)
		if !deleted[r.Build] {
			errs = append(errs, err)
		}
	}
	for tag, r := range tags {
		if deleted[r.Build] {
			dropped = append(dropped, tag)
			pointing[tag] = r.Build
		}
	}
	if len(dropped) > 0 {
		// A tag that a build finishing meanwhile moved stays.
		stale, err := s.tags.removeIf(name, dropped, pointing)
		if err != nil {
			gone = append(gone, err)
		}
		s.dropBuilds(ctx, stale)
	}
	return true, errors.Join(append(errs, gone...)...)
}

// filesRetention is how long uploaded COPY files are kept: a build after
// that uploads them again (the SDK asks first).
const filesRetention = 7 * 24 * time.Hour

// collectFiles removes the uploads made more than filesRetention before
// now, while no build runs (one may be reading them).
func (s *Server) collectFiles(now time.Time) {
	if s.builds.running() {
		return
	}
	entries, err := os.ReadDir(s.filesDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !filesHashPattern.MatchString(e.Name()) || now.Sub(fi.ModTime()) < filesRetention {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.filesDir(), e.Name())); err != nil {
			s.log.Warn("removing old template build files", "hash", e.Name(), "error", err)
		}
	}
}

// running reports whether a build is running.
func (bs *builds) running() bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, b := range bs.m {
		b.mu.Lock()
		run := b.status == "building"
		b.mu.Unlock()
		if run {
			return true
		}
	}
	return false
}
