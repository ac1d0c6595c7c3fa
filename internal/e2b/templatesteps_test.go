package e2b

import (
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
)

// TestBuildSteps: each E2B step becomes one instruction whose line is the
// step's number; what Corral refuses names the step as E2B's status does.
func TestBuildSteps(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	uploaded := func(h string) bool { return h == hash }
	body := buildBody{FromImage: "debian:stable", Steps: []buildStep{
		{Type: "RUN", Args: []string{"apt-get update"}},
		{Type: "RUN", Args: []string{"pip install x", "root"}},
		{Type: "ENV", Args: []string{"A", `say "hi" \ $HOME`, "B", "2"}},
		{Type: "COPY", Args: []string{"./app/", "/srv/", "user", "0755"}, FilesHash: hash},
		{Type: "WORKDIR", Args: []string{"/srv"}},
		{Type: "USER", Args: []string{"user"}},
	}}
	got, err := body.instructions(uploaded)
	if err != nil {
		t.Fatal(err)
	}
	want := []ociimage.Instruction{
		{Line: 0, Cmd: "FROM", Args: "debian:stable", Text: "FROM debian:stable"},
		{Line: 1, Cmd: "RUN", Args: "apt-get update", Text: "RUN apt-get update"},
		{Line: 2, Cmd: "RUN", Args: "pip install x", RunAs: "root", Text: "RUN pip install x"},
		{Line: 3, Cmd: "ENV", Args: `A="say \"hi\" \\ $HOME" B="2"`, Text: `ENV A="say \"hi\" \\ $HOME" B="2"`},
		{Line: 4, Cmd: "COPY", Flags: []string{"--chown=user", "--chmod=0755"}, JSON: []string{filepath.Join(hash, "app"), "/srv/"}, Text: "COPY ./app/ /srv/"},
		{Line: 5, Cmd: "WORKDIR", Args: "/srv", Text: "WORKDIR /srv"},
		{Line: 6, Cmd: "USER", Args: "user", Text: "USER user"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("instructions:\n got %+v\nwant %+v", got, want)
	}

	for _, tt := range []struct {
		name string
		body buildBody
		step string
		code error
	}{
		{"no base", buildBody{}, "base", errdefs.ErrInvalidArgument},
		{"two bases", buildBody{FromImage: "a", FromTemplate: "b"}, "base", errdefs.ErrInvalidArgument},
		{"credentials", buildBody{FromImage: "a", FromImageRegistry: &registryConfig{Type: "aws"}}, "base", errdefs.ErrNotImplemented},
		{"bad template", buildBody{FromTemplate: "Bad/Name"}, "base", errdefs.ErrInvalidArgument},
		{"unknown step", buildBody{FromImage: "a", Steps: []buildStep{{Type: "RUN", Args: []string{"x"}}, {Type: "HEALTHCHECK"}}}, "2", errdefs.ErrNotImplemented},
		{"odd ENV", buildBody{FromImage: "a", Steps: []buildStep{{Type: "ENV", Args: []string{"A"}}}}, "1", errdefs.ErrInvalidArgument},
		{"bad ENV name", buildBody{FromImage: "a", Steps: []buildStep{{Type: "ENV", Args: []string{"A B", "1"}}}}, "1", errdefs.ErrInvalidArgument},
		{"COPY not uploaded", buildBody{FromImage: "a", Steps: []buildStep{{Type: "COPY", Args: []string{"x", "/y"}, FilesHash: strings.Repeat("cd", 32)}}}, "1", errdefs.ErrFailedPrecondition},
		{"COPY bad hash", buildBody{FromImage: "a", Steps: []buildStep{{Type: "COPY", Args: []string{"x", "/y"}, FilesHash: "../x"}}}, "1", errdefs.ErrInvalidArgument},
		{"COPY bad mode", buildBody{FromImage: "a", Steps: []buildStep{{Type: "COPY", Args: []string{"x", "/y", "", "9z"}, FilesHash: hash}}}, "1", errdefs.ErrInvalidArgument},
		{"empty RUN", buildBody{FromImage: "a", Steps: []buildStep{{Type: "RUN", Args: []string{" "}}}}, "1", errdefs.ErrInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.body.instructions(uploaded)
			if !errors.Is(err, tt.code) || failedStep(err) != tt.step {
				t.Errorf("error %v (step %q), want %v naming step %q", err, failedStep(err), tt.code, tt.step)
			}
		})
	}

	if sv, err := (buildBody{StartCmd: "serve", ReadyCmd: "test -f /ready"}).service(); err != nil || sv.Shell != "serve" || sv.Ready.Shell != "test -f /ready" {
		t.Errorf("service = %+v, %v", sv, err)
	}
	if _, err := (buildBody{ReadyCmd: "true"}).service(); failedStep(err) != "finalize" {
		t.Errorf("ready command alone: %v, want a finalize error", err)
	}
}

// TestTagTable: tags point at builds, moving a tag or dropping it reports
// the builds no tag points at any more, and the table survives a reopen.
func TestTagTable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tags.json")
	tags, err := openTags(file)
	if err != nil {
		t.Fatal(err)
	}
	if stale, err := tags.set("app", "app", []string{"default", "v1"}); err != nil || len(stale) != 0 {
		t.Fatalf("set: %v, %v", stale, err)
	}
	if stale, err := tags.set("app", "app-2", []string{"default"}); err != nil || len(stale) != 0 {
		t.Fatalf("moving default: %v, %v (v1 still points at the first build)", stale, err)
	}
	if stale, err := tags.set("app", "app-2", []string{"v1"}); err != nil || !reflect.DeepEqual(stale, []string{"app"}) {
		t.Fatalf("moving v1: %v, %v; want the first build reported", stale, err)
	}
	reopened, err := openTags(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"app", "app:default", "app:v1"} {
		if b, ok := reopened.resolve(ref); !ok || b != "app-2" {
			t.Errorf("resolve %s after reopen = %q, %v", ref, b, ok)
		}
	}
	if _, ok := reopened.resolve("app:v9"); ok {
		t.Error("an unknown tag resolves")
	}
	if _, err := reopened.remove("app", []string{"v9"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("removing an unknown tag: %v", err)
	}
	if stale, err := reopened.remove("app", nil); err != nil || !reflect.DeepEqual(stale, []string{"app-2"}) {
		t.Errorf("removing all: %v, %v", stale, err)
	}
	if _, _, err := splitName("App:x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("upper-case name: %v", err)
	}
	if _, _, err := splitName("app:bad tag"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad tag: %v", err)
	}
}

// TestBuildsPrune: finished builds are forgotten after buildRetention,
// builds never started after waitRetention, running ones never.
func TestBuildsPrune(t *testing.T) {
	now := time.Now()
	bs := builds{m: map[string]*build{
		"done":    {status: "ready", changed: now.Add(-2 * buildRetention)},
		"failed":  {status: "error", changed: now.Add(-2 * buildRetention)},
		"idle":    {status: "waiting", changed: now.Add(-2 * waitRetention)},
		"uploads": {status: "waiting", changed: now.Add(-2 * buildRetention)},
		"running": {status: "building", changed: now.Add(-2 * buildRetention)},
		"recent":  {status: "ready", changed: now.Add(-time.Minute)},
	}}
	bs.prune(now)
	var left []string
	for id := range bs.m {
		left = append(left, id)
	}
	slices.Sort(left)
	if !reflect.DeepEqual(left, []string{"recent", "running", "uploads"}) {
		t.Errorf("after prune: %v", left)
	}
}

// TestBuildLogLines: output written in chunks that split lines makes one
// entry per line; a carriage return ends a line; an overlong line is cut;
// the last line without a newline comes out at flush.
func TestBuildLogLines(t *testing.T) {
	b := &build{}
	for _, chunk := range []string{"step 1/2: RUN x\nhal", "f a line\n", "10%\r20%\r", strings.Repeat("y", 2*maxLogLine), "\nlast"} {
		b.Write([]byte(chunk))
	}
	b.flush()
	var got []string
	for _, e := range b.logs {
		got = append(got, e.Message)
	}
	want := []string{"step 1/2: RUN x", "half a line", "10%", "20%", strings.Repeat("y", maxLogLine) + " [cut]", "last"}
	if len(got) != len(want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] && !(i == 4 && strings.HasPrefix(got[i], strings.Repeat("y", 100))) {
			t.Errorf("entry %d = %.40q, want %.40q", i, got[i], want[i])
		}
	}
}

// TestTagTableRemoveIf: a delete drops a tag only while it points at the
// build the delete removed; builds kept for later survive a reopen.
func TestTagTableRemoveIf(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tags.json")
	tags, err := openTags(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tags.set("app", "app", []string{"default", "v1"}); err != nil {
		t.Fatal(err)
	}
	// A build finished meanwhile and moved default.
	if _, err := tags.set("app", "app-2", []string{"default"}); err != nil {
		t.Fatal(err)
	}
	stale, err := tags.removeIf("app", []string{"default", "v1"}, map[string]string{"default": "app", "v1": "app"})
	if err != nil || !reflect.DeepEqual(stale, []string{"app"}) {
		t.Fatalf("removeIf: %v, %v", stale, err)
	}
	if b, ok := tags.resolve("app"); !ok || b != "app-2" {
		t.Errorf("the moved tag: %q, %v; want it kept on app-2", b, ok)
	}
	made := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	orphans := []orphan{{Build: "old-1", CreatedAt: made}, {Build: "old-2", CreatedAt: made}}
	if err := tags.addOrphans(orphans); err != nil {
		t.Fatal(err)
	}
	if !tags.isOrphan("old-1") || tags.isOrphan("app-2") {
		t.Error("isOrphan")
	}
	reopened, err := openTags(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := reopened.takeOrphans(); !reflect.DeepEqual(got, orphans) {
		t.Errorf("orphans after reopen: %v", got)
	}
	if got := reopened.takeOrphans(); len(got) != 0 {
		t.Errorf("orphans taken twice: %v", got)
	}
}

// TestForceFrom: skipCache before the base forces the whole build, before
// a step that step on (numbered from the base as step 1).
func TestForceFrom(t *testing.T) {
	steps := []buildStep{{Type: "RUN"}, {Type: "RUN", Force: true}, {Type: "RUN", Force: true}}
	for _, tt := range []struct {
		body buildBody
		want int
	}{
		{buildBody{Steps: steps[:1]}, 0},
		{buildBody{Steps: steps}, 3},
		{buildBody{Force: true, Steps: steps[:1]}, 1},
	} {
		if got := tt.body.forceFrom(); got != tt.want {
			t.Errorf("forceFrom of %+v = %d, want %d", tt.body, got, tt.want)
		}
	}
}
