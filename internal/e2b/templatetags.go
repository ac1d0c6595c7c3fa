package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/sandbox"
)

// E2B names a template "name" or "name:tag"; a build of it is a Corral
// template (its buildID is that template's name), and a tag points at
// one build. "name" alone means the tag "default". The first build of a
// name is the Corral template of that name; later builds get a suffix,
// so a rebuild never touches the build that sandboxes may be using until
// it succeeds. The table of tags is kept in one JSON file, rewritten
// whole on each change.

// defaultTag is the tag of a name given without one.
const defaultTag = "default"

// tagPattern is what a tag may look like.
var tagPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// tagRef is one tag of a name and the build it points at.
type tagRef struct {
	Build     string    `json:"build"`
	CreatedAt time.Time `json:"created_at"`
}

// tagTable maps names to their tags, and lists the builds no tag points
// at that are still to be deleted (a sandbox or snapshot used them when
// their last tag went). Safe for concurrent use.
type tagTable struct {
	file    string // "" keeps the table in memory only
	mu      sync.Mutex
	tags    map[string]map[string]tagRef
	orphans []orphan
}

// orphan is a build no tag points at that is still to be deleted; it is
// the template of that name only while CreatedAt matches, since a later
// template may take the name once this one is gone.
type orphan struct {
	Build     string    `json:"build"`
	CreatedAt time.Time `json:"created_at"`
}

// tagFile is the table as it is saved.
type tagFile struct {
	Tags    map[string]map[string]tagRef `json:"tags"`
	Orphans []orphan                     `json:"orphans,omitempty"`
}

// openTags reads the table at file, if there is one.
func openTags(file string) (*tagTable, error) {
	t := &tagTable{file: file, tags: map[string]map[string]tagRef{}}
	if file == "" {
		return t, nil
	}
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading template tags: %w", err)
	}
	var f tagFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("reading template tags %s: %w", file, err)
	}
	if f.Tags != nil {
		t.tags = f.Tags
	}
	t.orphans = f.Orphans
	return t, nil
}

// splitName parses "name[:tag]" into a template name and a tag.
func splitName(ref string) (name, tag string, err error) {
	name, tag, ok := strings.Cut(ref, ":")
	if !ok || tag == "" {
		tag = defaultTag
	}
	if err := sandbox.ValidateTemplateName(name); err != nil {
		return "", "", err
	}
	if !tagPattern.MatchString(tag) {
		return "", "", errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid tag %q: use lower-case letters, digits, '.', '_' and '-'", tag)
	}
	return name, tag, nil
}

// resolve returns the build that ref ("name[:tag]") points at.
func (t *tagTable) resolve(ref string) (string, bool) {
	name, tag, err := splitName(ref)
	if err != nil {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.tags[name][tag]
	return r.Build, ok
}

// set points tags of name at build and returns the builds no tag points
// at any more.
func (t *tagTable) set(name, build string, tags []string) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	before := t.buildsOf(name)
	old := t.tags[name]
	next := make(map[string]tagRef, len(old)+len(tags))
	for k, v := range old {
		next[k] = v
	}
	now := time.Now().UTC()
	for _, tag := range tags {
		next[tag] = tagRef{Build: build, CreatedAt: now}
	}
	t.tags[name] = next
	if err := t.save(); err != nil {
		t.restore(name, old)
		return nil, err
	}
	return unused(before, t.buildsOf(name)), nil
}

// restore puts back the tags of name as they were (nil: none). Called
// with mu.
func (t *tagTable) restore(name string, old map[string]tagRef) {
	if old == nil {
		delete(t.tags, name)
		return
	}
	t.tags[name] = old
}

// remove drops tags of name and returns the builds no tag points at any
// more. Naming no tags drops them all.
func (t *tagTable) remove(name string, tags []string) ([]string, error) {
	return t.removeIf(name, tags, nil)
}

// removeIf is remove, except that with pointing a tag is dropped only
// while it still points at pointing[tag]: a tag moved meanwhile (a build
// that finished) stays.
func (t *tagTable) removeIf(name string, tags []string, pointing map[string]string) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.tags[name]
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "template %q has no tags", name)
	}
	before := t.buildsOf(name)
	next := map[string]tagRef{}
	if len(tags) > 0 {
		for _, tag := range tags {
			if _, ok := old[tag]; !ok && pointing == nil {
				return nil, errdefs.Errorf(errdefs.ErrNotFound, "template %q has no tag %q", name, tag)
			}
		}
		for k, v := range old {
			if b, ok := pointing[k]; !slices.Contains(tags, k) || (pointing != nil && (!ok || b != v.Build)) {
				next[k] = v
			}
		}
	}
	if len(next) == 0 {
		delete(t.tags, name)
	} else {
		t.tags[name] = next
	}
	if err := t.save(); err != nil {
		t.restore(name, old)
		return nil, err
	}
	return unused(before, t.buildsOf(name)), nil
}

// addOrphans records builds to delete later; takeOrphans returns them
// all and forgets them (the caller adds back those it could not delete).
func (t *tagTable) addOrphans(builds []orphan) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	before := t.orphans
	for _, b := range builds {
		if !slices.Contains(t.orphans, b) {
			t.orphans = append(t.orphans, b)
		}
	}
	if err := t.save(); err != nil {
		t.orphans = before
		return err
	}
	return nil
}

func (t *tagTable) takeOrphans() []orphan {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.orphans
	t.orphans = nil
	if err := t.save(); err != nil {
		t.orphans = out
		return nil
	}
	return out
}

// isOrphan reports whether build is waiting to be deleted, so that a new
// build does not take its name.
func (t *tagTable) isOrphan(build string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.ContainsFunc(t.orphans, func(o orphan) bool { return o.Build == build })
}

// list returns the tags of name by tag.
func (t *tagTable) list(name string) map[string]tagRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]tagRef, len(t.tags[name]))
	for k, v := range t.tags[name] {
		out[k] = v
	}
	return out
}

// names returns the names and tags pointing at build.
func (t *tagTable) namesOf(build string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for name, tags := range t.tags {
		for tag, r := range tags {
			if r.Build == build {
				out = append(out, name+":"+tag)
			}
		}
	}
	slices.Sort(out)
	return out
}

// buildsOf lists the builds the tags of name point at. Called with mu.
func (t *tagTable) buildsOf(name string) []string {
	var out []string
	for _, r := range t.tags[name] {
		if !slices.Contains(out, r.Build) {
			out = append(out, r.Build)
		}
	}
	return out
}

// unused returns the builds of before missing from after.
func unused(before, after []string) []string {
	var out []string
	for _, b := range before {
		if !slices.Contains(after, b) {
			out = append(out, b)
		}
	}
	return out
}

// save writes the table (atomically: a temporary file renamed over it).
// Called with mu.
func (t *tagTable) save() error {
	if t.file == "" {
		return nil
	}
	b, err := json.Marshal(tagFile{Tags: t.tags, Orphans: t.orphans})
	if err != nil {
		return err
	}
	tmp := t.file + ".tmp"
	if err := os.MkdirAll(filepath.Dir(t.file), 0o700); err != nil {
		return fmt.Errorf("saving template tags: %w", err)
	}
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("saving template tags: %w", err)
	}
	if err := os.Rename(tmp, t.file); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("saving template tags: %w", err)
	}
	return nil
}
