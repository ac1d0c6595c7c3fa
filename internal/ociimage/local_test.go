package ociimage

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

// TestBuildFromLocal: a FROM of a local tree (Instruction.FromTemplate)
// starts from the tree Local fills and from its defaults; the key follows
// the base's, so a new base runs the later steps again; RunAs changes the
// user of one RUN step only; failures carry the instruction's line.
func TestBuildFromLocal(t *testing.T) {
	e := newBuildEnv(t)
	var users []string
	runner := runnerFunc(func(ctx context.Context, root string, st Step) error {
		users = append(users, st.User)
		return e.runner.Run(ctx, root, st, nil)
	})
	e.b.Runner = runner
	key := "v1"
	fills := 0
	e.b.Local = func(_ context.Context, name string) (*LocalBase, error) {
		if name != "base" {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", name)
		}
		return &LocalBase{Key: key, Defaults: Defaults{Env: []string{"FROM_BASE=yes"}, User: "app"},
			Fill: func(_ context.Context, dir string) error {
				fills++
				return os.WriteFile(filepath.Join(dir, "base.txt"), []byte("base"), 0o644)
			}}, nil
	}
	file := []Instruction{
		{Line: 0, Cmd: "FROM", FromTemplate: "base", Text: "FROM template base"},
		{Line: 1, Cmd: "RUN", Args: `test "$FROM_BASE" = yes && cat base.txt > copied`},
		{Line: 2, Cmd: "RUN", Args: "true", RunAs: "root"},
	}
	build := func() (*BuildResult, error) {
		return e.b.Build(t.Context(), file, BuildOptions{Context: e.context})
	}
	res, err := build()
	if err != nil {
		t.Fatal(err)
	}
	if got := e.export(t, res); got["copied"] != "file:base" || got["base.txt"] != "file:base" {
		t.Errorf("tree = %v, want the base's file and the step's copy of it", got)
	}
	if len(users) != 2 || users[0] != "app" || users[1] != "root" {
		t.Errorf("RUN users = %v, want the base's user, then RunAs", users)
	}
	if res.Defaults.User != "app" {
		t.Errorf("result user = %q, want the base's (RunAs is one step's)", res.Defaults.User)
	}
	if _, err := build(); err != nil || fills != 1 {
		t.Errorf("unchanged rebuild: %v, base filled %d times, want once", err, fills)
	}
	key = "v2"
	if _, err := build(); err != nil || fills != 2 {
		t.Errorf("rebuild on a new base: %v, base filled %d times, want twice", err, fills)
	}

	file[0].FromTemplate = "missing"
	_, err = build()
	var le *LineError
	if !errors.As(err, &le) || le.Line != 0 || !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing base: %v, want a not-found LineError of line 0", err)
	}
	file[0].FromTemplate = "base"
	file[2].Args = "exit 4"
	_, err = build()
	if !errors.As(err, &le) || le.Line != 2 || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("failing step: %v, want a LineError of line 2", err)
	}
	e.b.Local = nil
	if _, err := build(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("local FROM without Local: %v, want failed_precondition", err)
	}
}

// runnerFunc is a Runner from a function; output is discarded.
type runnerFunc func(ctx context.Context, root string, st Step) error

func (f runnerFunc) Run(ctx context.Context, root string, st Step, _ io.Writer) error {
	return f(ctx, root, st)
}

// TestBuildForceFrom: ForceFrom runs the step it names and every later
// one although they are cached, and leaves the earlier ones cached; a
// later plain build still finds the first build's results.
func TestBuildForceFrom(t *testing.T) {
	e := newBuildEnv(t)
	ins, err := ParseBuildFile(strings.NewReader(fiveRuns))
	if err != nil {
		t.Fatal(err)
	}
	build := func(force int) int {
		t.Helper()
		if _, err := e.b.Build(t.Context(), ins, BuildOptions{Context: e.context, ForceFrom: force}); err != nil {
			t.Fatal(err)
		}
		return len(e.runner.take())
	}
	if n := build(0); n != 5 {
		t.Fatalf("first build ran %d commands, want 5", n)
	}
	// Steps: 1 FROM, 2 ARG, 3 ENV, 4 WORKDIR, 5 COPY, 6-10 RUN s1..s5.
	if n := build(8); n != 3 {
		t.Errorf("ForceFrom 8 ran %d commands, want 3 (s3, s4, s5)", n)
	}
	if n := build(1); n != 5 {
		t.Errorf("ForceFrom 1 ran %d commands, want all 5", n)
	}
	if n := build(0); n != 0 {
		t.Errorf("a plain rebuild ran %d commands, want none", n)
	}
}
