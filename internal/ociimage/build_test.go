package ociimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
)

// fakeRunner runs RUN commands on the host with sh, in the step's tree as
// working directory and without any isolation, and records them. $ROOT is
// the tree, for commands that need it.
type fakeRunner struct {
	mu  sync.Mutex
	ran []string
}

func (r *fakeRunner) Run(ctx context.Context, root string, st Step, out io.Writer) error {
	r.mu.Lock()
	r.ran = append(r.ran, st.Command[len(st.Command)-1])
	r.mu.Unlock()
	cmd := exec.CommandContext(ctx, st.Command[0], st.Command[1:]...)
	cmd.Dir = filepath.Join(root, st.WorkingDir)
	cmd.Env = append(st.Env, "ROOT="+root)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("running %q: %w: %w", st.Args, err, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (r *fakeRunner) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ran
	r.ran = nil
	return out
}

const fiveRuns = `# syntax=docker/dockerfile:1
ARG BASE=scratch
FROM ${BASE} AS build
ARG GREETING=hello
ENV NAME=corral \
    QUOTED="a b"
WORKDIR /work
COPY src/ ./src/
RUN echo "$GREETING $NAME" > s1 && test -f src/a.txt
RUN cat s1 > s2 && echo two >> s2
RUN cat s2 > s3 && echo three >> s3
RUN ["/bin/sh", "-c", "cat s3 > s4 && echo four >> s4"]
RUN cat s4 > s5 && \
    # a comment inside a continuation
    echo five >> s5
USER 1000:1000
CMD ["python3"]
`

// buildEnv is a builder with a fake runner, a snapshot directory and a
// build context holding src/a.txt.
type buildEnv struct {
	b       *Builder
	runner  *fakeRunner
	snaps   *DirStepCache
	context string
}

func newBuildEnv(t *testing.T) *buildEnv {
	t.Helper()
	snaps, err := OpenDirStepCache(filepath.Join(t.TempDir(), "build"))
	if err != nil {
		t.Fatal(err)
	}
	ctxDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ctxDir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "src", "a.txt"), []byte("A"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &fakeRunner{}
	return &buildEnv{b: &Builder{Steps: snaps, Runner: r}, runner: r, snaps: snaps, context: ctxDir}
}

func (e *buildEnv) build(t *testing.T, file string, args map[string]string) (*BuildResult, error) {
	t.Helper()
	ins, err := ParseBuildFile(strings.NewReader(file))
	if err != nil {
		return nil, err
	}
	return e.b.Build(t.Context(), ins, BuildOptions{Context: e.context, Args: args})
}

func (e *buildEnv) export(t *testing.T, res *BuildResult) map[string]string {
	t.Helper()
	dir := t.TempDir()
	if err := e.b.Export(t.Context(), res, dir); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return tree(t, dir)
}

// commandOf returns the command of the RUN step that writes file sN.
func commandOf(file string, n int) string {
	for _, line := range strings.Split(file, "\n") {
		if strings.Contains(line, fmt.Sprintf("> s%d", n)) {
			return line
		}
	}
	return ""
}

func TestBuildFiveRunSteps(t *testing.T) {
	e := newBuildEnv(t)
	res, err := e.build(t, fiveRuns, nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if got := len(e.runner.take()); got != 5 {
		t.Errorf("first build ran %d commands, want 5", got)
	}
	want := map[string]string{
		"work": "dir", "work/src": "dir", "work/src/a.txt": "file:A",
		"work/s1": "file:hello corral\n",
		"work/s2": "file:hello corral\ntwo\n",
		"work/s3": "file:hello corral\ntwo\nthree\n",
		"work/s4": "file:hello corral\ntwo\nthree\nfour\n",
		"work/s5": "file:hello corral\ntwo\nthree\nfour\nfive\n",
	}
	if diff := cmp.Diff(want, e.export(t, res)); diff != "" {
		t.Errorf("built tree (-want +got):\n%s", diff)
	}
	wantDefaults := Defaults{
		Env:        []string{"NAME=corral", "QUOTED=a b"},
		WorkingDir: "/work",
		User:       "1000:1000",
		Cmd:        []string{"python3"},
	}
	if diff := cmp.Diff(wantDefaults, res.Defaults); diff != "" {
		t.Errorf("Defaults (-want +got):\n%s", diff)
	}

	// An unchanged rebuild runs nothing and is fast.
	began := time.Now()
	again, err := e.build(t, fiveRuns, nil)
	elapsed := time.Since(began)
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if got := e.runner.take(); len(got) != 0 {
		t.Errorf("unchanged rebuild ran %q, want nothing", got)
	}
	if len(again.Ran) != 0 {
		t.Errorf("unchanged rebuild ran steps %v", again.Ran)
	}
	if again.Key != res.Key {
		t.Errorf("unchanged rebuild key %s, first %s", again.Key, res.Key)
	}
	if elapsed > time.Second {
		t.Errorf("unchanged rebuild took %s, want under 1s", elapsed)
	}
	t.Logf("unchanged rebuild took %s", elapsed)

	// Changing the third RUN reruns the third to fifth.
	changed := strings.Replace(fiveRuns, "echo three", "echo THREE", 1)
	res3, err := e.build(t, changed, nil)
	if err != nil {
		t.Fatalf("build with step 3 changed: %v", err)
	}
	wantRan := []string{
		strings.TrimPrefix(commandOf(changed, 3), "RUN "),
		"cat s3 > s4 && echo four >> s4",
		"cat s4 > s5 &&     echo five >> s5",
	}
	if diff := cmp.Diff(wantRan, e.runner.take()); diff != "" {
		t.Errorf("commands run after changing RUN 3 (-want +got):\n%s", diff)
	}
	if got := e.export(t, res3)["work/s5"]; got != "file:hello corral\ntwo\nTHREE\nfour\nfive\n" {
		t.Errorf("s5 after the change = %q", got)
	}
	for i, st := range res3.Steps {
		if same := st.Key == res.Steps[i].Key; same != (i < 7) {
			t.Errorf("step %d (%s): key unchanged = %v", st.Number, st.Text, same)
		}
	}
}

func TestBuildInvalidation(t *testing.T) {
	tests := []struct {
		name    string
		change  func(e *buildEnv, file string) (string, map[string]string)
		wantRun int
	}{
		{"copied file content", func(e *buildEnv, f string) (string, map[string]string) {
			os.WriteFile(filepath.Join(e.context, "src", "a.txt"), []byte("changed"), 0o644)
			return f, nil
		}, 5},
		{"build argument", func(e *buildEnv, f string) (string, map[string]string) {
			return f, map[string]string{"GREETING": "hi"}
		}, 5},
		{"trailing USER only", func(e *buildEnv, f string) (string, map[string]string) {
			return strings.Replace(f, "USER 1000:1000", "USER 0", 1), nil
		}, 0},
		{"file outside the copied directory", func(e *buildEnv, f string) (string, map[string]string) {
			os.WriteFile(filepath.Join(e.context, "unrelated"), []byte("x"), 0o644)
			return f, nil
		}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newBuildEnv(t)
			if _, err := e.build(t, fiveRuns, nil); err != nil {
				t.Fatal(err)
			}
			e.runner.take()
			file, args := tc.change(e, fiveRuns)
			if _, err := e.build(t, file, args); err != nil {
				t.Fatal(err)
			}
			if got := len(e.runner.take()); got != tc.wantRun {
				t.Errorf("rebuild ran %d commands, want %d", got, tc.wantRun)
			}
		})
	}
}

func TestBuildFailedStepLeavesEarlierStepsCached(t *testing.T) {
	e := newBuildEnv(t)
	failing := strings.Replace(fiveRuns, "echo four >> s4", "exit 3", 1)
	_, err := e.build(t, failing, nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "step 9/12 (line 12) RUN") {
		t.Fatalf("Build error = %v, want the failed RUN step named", err)
	}
	if got := len(e.runner.take()); got != 4 {
		t.Errorf("failing build ran %d commands, want 4", got)
	}
	work, _ := os.ReadDir(e.snaps.workDir())
	if len(work) != 0 {
		t.Errorf("failed build left work directories: %v", work)
	}
	if _, err := e.build(t, fiveRuns, nil); err != nil {
		t.Fatal(err)
	}
	if got := len(e.runner.take()); got != 2 {
		t.Errorf("build after the fix ran %d commands, want 2 (steps 4 and 5)", got)
	}
}

func TestBuildFromImage(t *testing.T) {
	c := openCache(t)
	base, err := c.Load(t.Context(), writeLayout(t, whiteoutImage(t)), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := newBuildEnv(t)
	resolved := 0
	e.b.Resolve = func(ctx context.Context, ref string) (*Image, error) {
		resolved++
		if ref != "example/base:1" {
			return nil, fmt.Errorf("unknown image %s: %w", ref, errdefs.ErrNotFound)
		}
		return base, nil
	}
	file := "FROM example/base:1\nENV LANG=C\nRUN test -f $ROOT/etc/keep && ! test -e $ROOT/etc/secret && echo ok > built\nWORKDIR /new/dir\n"
	res, err := e.build(t, file, nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	want := map[string]string{}
	for k, v := range whiteoutTree {
		want[k] = v
	}
	want["srv/app/built"] = "file:ok\n"
	want["new"], want["new/dir"] = "dir", "dir"
	if diff := cmp.Diff(want, e.export(t, res)); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
	wantEnv := []string{"PATH=/usr/bin:/bin", "LANG=C"}
	if diff := cmp.Diff(wantEnv, res.Defaults.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if res.Defaults.WorkingDir != "/new/dir" || res.Defaults.User != "1000:1000" {
		t.Errorf("Defaults = %+v", res.Defaults)
	}
	if _, err := e.build(t, "FROM example/missing:1\n", nil); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "line 1: FROM") {
		t.Errorf("build from a missing image: %v, want ErrNotFound naming line 1", err)
	}
}

func TestBuildCopyRules(t *testing.T) {
	e := newBuildEnv(t)
	for name, body := range map[string]string{"one.txt": "1", "two.txt": "2", "dir/sub/deep": "d"} {
		p := filepath.Join(e.context, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../../etc/passwd", filepath.Join(e.context, "dir", "sub", "link")); err != nil {
		t.Fatal(err)
	}
	file := `FROM scratch
COPY one.txt /renamed
COPY *.txt /multi/
COPY dir /copied
WORKDIR /w
COPY ["one.txt", "rel/"]
COPY --chmod=600 --chown=12:34 two.txt /owned
`
	res, err := e.build(t, file, nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	want := map[string]string{
		"renamed": "file:1",
		"multi":   "dir", "multi/one.txt": "file:1", "multi/two.txt": "file:2",
		"copied": "dir", "copied/sub": "dir", "copied/sub/deep": "file:d", "copied/sub/link": "link:../../../etc/passwd",
		"w": "dir", "w/rel": "dir", "w/rel/one.txt": "file:1",
		"owned": "file:2",
	}
	dir := t.TempDir()
	if err := e.b.Export(t.Context(), res, dir); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, tree(t, dir)); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
	fi, err := os.Stat(filepath.Join(dir, "owned"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode of --chmod file = %v", fi.Mode())
	}
	if os.Geteuid() == 0 {
		if st := statOwner(t, filepath.Join(dir, "owned")); st != [2]int{12, 34} {
			t.Errorf("owner of --chown file = %v", st)
		}
		if st := statOwner(t, filepath.Join(dir, "renamed")); st != [2]int{0, 0} {
			t.Errorf("owner of copied file = %v, want root", st)
		}
	}
}

func statOwner(t *testing.T, p string) [2]int {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [2]int{int(st.Uid), int(st.Gid)}
}

func TestBuildRefuses(t *testing.T) {
	e := newBuildEnv(t)
	os.WriteFile(filepath.Join(e.context, "a.tar.gz"), []byte{0x1f, 0x8b, 8, 0, 0, 0}, 0o644)
	os.Symlink("/etc/passwd", filepath.Join(e.context, "escape"))
	tests := []struct {
		name, file string
		kind       error
		msg        string
	}{
		{"ADD of a URL", "FROM scratch\nADD https://example.com/x /x\n", errdefs.ErrNotImplemented, "line 2: ADD: ADD of URL"},
		{"ADD of an archive", "FROM scratch\nADD a.tar.gz /x/\n", errdefs.ErrNotImplemented, "line 2: ADD: ADD of archive a.tar.gz"},
		{"COPY from outside the context", "FROM scratch\nCOPY ../etc/passwd /x\n", errdefs.ErrInvalidArgument, "outside the build context"},
		{"COPY of a symlink out of the context", "FROM scratch\nCOPY escape /x\n", errdefs.ErrInvalidArgument, `line 2: COPY: source "escape"`},
		{"COPY of a missing file", "FROM scratch\nCOPY nope /x\n", errdefs.ErrInvalidArgument, `line 2: COPY: source "nope"`},
		{"COPY --from", "FROM scratch\nCOPY --from=build /a /b\n", errdefs.ErrNotImplemented, "multi-stage"},
		{"second FROM", "FROM scratch\nFROM scratch\n", errdefs.ErrNotImplemented, "line 2: FROM: multi-stage"},
		{"RUN --mount", "FROM scratch\nRUN --mount=type=cache,target=/x true\n", errdefs.ErrNotImplemented, "--mount=type=cache,target=/x is not supported"},
		{"RUN before FROM", "RUN true\n", errdefs.ErrInvalidArgument, "line 1: a build file starts with FROM"},
		{"several sources into a file", "FROM scratch\nCOPY src/a.txt src/a.txt /x\n", errdefs.ErrInvalidArgument, "must be a directory ending in /"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.build(t, tc.file, nil)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error = %v, want %v containing %q", err, tc.kind, tc.msg)
			}
		})
	}
	if got := e.runner.take(); len(got) != 0 {
		t.Errorf("refused builds ran %q", got)
	}
}

func TestParseBuildFile(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []Instruction
		kind error
		msg  string
	}{
		{
			name: "continuations, comments, forms and flags",
			file: "# syntax=docker/dockerfile:1\n\n  # indented comment\nfrom alpine\nrun echo a \\\n  b \\\n\n  # gone\n  c\nCMD [\"a\", \"b c\"]\nCOPY --chown=1:2 x /y\n",
			want: []Instruction{
				{Line: 4, Cmd: "FROM", Args: "alpine", Text: "from alpine"},
				{Line: 5, Cmd: "RUN", Args: "echo a   b   c", Text: "run echo a   b   c"},
				{Line: 10, Cmd: "CMD", Args: `["a", "b c"]`, JSON: []string{"a", "b c"}, Text: `CMD ["a", "b c"]`},
				{Line: 11, Cmd: "COPY", Flags: []string{"--chown=1:2"}, Args: "x /y", Text: "COPY --chown=1:2 x /y"},
			},
		},
		{name: "unsupported instruction", file: "FROM a\nRUN x\nEXPOSE 80\n", kind: errdefs.ErrNotImplemented, msg: "line 3: EXPOSE is not supported"},
		{name: "unknown instruction", file: "FROM a\nFETCH x\n", kind: errdefs.ErrInvalidArgument, msg: `line 2: unknown instruction "FETCH"`},
		{name: "here-document", file: "FROM a\nRUN <<EOF\necho\nEOF\n", kind: errdefs.ErrNotImplemented, msg: "line 2: here-documents"},
		{name: "escape directive", file: "# escape=`\nFROM a\n", kind: errdefs.ErrNotImplemented, msg: "line 1: the escape directive"},
		{name: "empty", file: "# nothing\n", kind: errdefs.ErrInvalidArgument, msg: "no instructions"},
		{name: "missing arguments", file: "FROM a\nWORKDIR\n", kind: errdefs.ErrInvalidArgument, msg: "line 2: WORKDIR needs arguments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBuildFile(strings.NewReader(tc.file))
			if tc.kind != nil {
				if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("error = %v, want %v containing %q", err, tc.kind, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("instructions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLexer(t *testing.T) {
	vars := map[string]string{"A": "one", "EMPTY": "", "SP": "x y"}
	lx := lexer{lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
	tests := []struct {
		in   string
		want []string
	}{
		{`$A ${A}b "$A $SP" '$A'`, []string{"one", "oneb", "one x y", "$A"}},
		{`${MISSING:-dflt} ${EMPTY:-e} ${A:+set} ${MISSING:+set}x`, []string{"dflt", "e", "set", "x"}},
		{`a\ b "q\"uote" \$A`, []string{"a b", `q"uote`, "$A"}},
		{`K="v w" L=$A`, []string{"K=v w", "L=one"}},
		{`$ $1 cost$`, []string{"$", "$1", "cost$"}},
	}
	for _, tc := range tests {
		got, err := lx.words(tc.in)
		if err != nil {
			t.Errorf("words(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("words(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
	for _, bad := range []string{`"open`, `'open`, `${A`, `${A:?x}`, `${}`} {
		if _, err := lx.words(bad); err == nil {
			t.Errorf("words(%q) succeeded, want an error", bad)
		}
	}
}

// TestPlanOwnCommand checks that a plan tells a CMD or ENTRYPOINT of the
// build file from one inherited with the FROM image, whose configuration
// (ENTRYPOINT /bin/sh, CMD -c "echo hi") the result keeps either way.
func TestPlanOwnCommand(t *testing.T) {
	c := openCache(t)
	base, err := c.Load(t.Context(), writeLayout(t, whiteoutImage(t)), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name            string
		file            string
		own             bool
		entrypoint, cmd []string
	}{
		{"inherited", "FROM base\nENV A=1\n", false, []string{"/bin/sh"}, []string{"-c", "echo hi"}},
		{"own cmd keeps the entrypoint", "FROM base\nCMD [\"-c\", \"serve\"]\n", true, []string{"/bin/sh"}, []string{"-c", "serve"}},
		{"own entrypoint resets the cmd", "FROM base\nENTRYPOINT [\"/app\"]\n", true, []string{"/app"}, nil},
		{"shell form", "FROM scratch\nCMD serve --port 80\n", true, nil, []string{"/bin/sh", "-c", "serve --port 80"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newBuildEnv(t)
			e.b.Resolve = func(context.Context, string) (*Image, error) { return base, nil }
			ins, err := ParseBuildFile(strings.NewReader(tt.file))
			if err != nil {
				t.Fatal(err)
			}
			plan, err := e.b.Plan(t.Context(), ins, BuildOptions{Context: e.context})
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if plan.OwnCommand != tt.own {
				t.Errorf("OwnCommand = %v, want %v", plan.OwnCommand, tt.own)
			}
			if diff := cmp.Diff(tt.entrypoint, plan.Defaults.Entrypoint); diff != "" {
				t.Errorf("Entrypoint (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.cmd, plan.Defaults.Cmd); diff != "" {
				t.Errorf("Cmd (-want +got):\n%s", diff)
			}
		})
	}
}
