package sandbox

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/wire"
)

// execStdout runs req in sandbox id and returns its stdout.
func execStdout(t *testing.T, h *harness, id string, req wire.ExecRequest) string {
	t.Helper()
	var out strings.Builder
	err := h.m.Exec(t.Context(), id, req, func(ev wire.ExecEvent) error {
		if ev.Type == wire.EventStdout {
			out.Write(ev.Bytes())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("exec %+v: %v", req, err)
	}
	return out.String()
}

func TestTemplateDefaults(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	// The fake driver runs processes on the host: use a directory that
	// exists there.
	work := t.TempDir()
	want := Template{Name: "img", Source: "pull", Image: "example/img:1", Digest: "sha256:00",
		Defaults: &Defaults{Env: []string{"A=image", "B=image", "C=image", "NOVALUE"}, WorkingDir: work, Cmd: []string{"sh"}}}
	got, err := h.m.CreateTemplateFrom(ctx, want, func(dir string) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	want.CreatedAt = h.now.Now().UTC()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("CreateTemplateFrom returned (-want +got):\n%s", diff)
	}
	// The Manager keeps its own copy.
	got.Defaults.Env[0] = "A=changed"
	if stored, _ := h.m.Template(t.Context(), "img"); stored.Defaults.Env[0] != "A=image" {
		t.Fatalf("template record shares memory with a caller: %v", stored.Defaults.Env)
	}
	if recs, _ := h.store.Templates(ctx); len(recs) != 2 {
		t.Fatalf("store holds %d templates, want 2", len(recs))
	}

	sb, err := h.m.Create(ctx, Spec{Template: "img", Env: map[string]string{"B": "sandbox", "C": "sandbox"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  wire.ExecRequest
		want string
	}{
		{"layered env and working dir", wire.ExecRequest{Shell: `echo "$A $B $C $NOVALUE."; pwd`, Env: map[string]string{"C": "request"}},
			"image sandbox request .\n" + work + "\n"},
		{"cwd given", wire.ExecRequest{Shell: "pwd", Cwd: "/"}, "/\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := execStdout(t, h, sb.ID, tt.req); got != tt.want {
				t.Errorf("output %q, want %q", got, tt.want)
			}
		})
	}
	info, err := h.m.StartProcess(ctx, sb.ID, wire.StartRequest{ExecRequest: wire.ExecRequest{Cmd: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	if info.Cwd != work {
		t.Errorf("background process cwd %q, want the template's %q", info.Cwd, work)
	}

	// A template without defaults changes nothing.
	plain, err := h.m.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if got := execStdout(t, h, plain.ID, wire.ExecRequest{Shell: `echo "[$A]"`}); got != "[]\n" {
		t.Errorf("sandbox of a template without defaults sees %q", got)
	}
}

func TestRunOnTree(t *testing.T) {
	h := newHarness(t, nil)
	ctx := t.Context()
	root := t.TempDir()
	var out strings.Builder
	var exit wire.ExecEvent
	err := h.m.RunOnTree(ctx, TreeSpec{Root: root}, wire.ExecRequest{Shell: "echo $X; exit 3", Env: map[string]string{"X": "hi"}},
		func(ev wire.ExecEvent) error {
			switch ev.Type {
			case wire.EventStdout:
				out.Write(ev.Bytes())
			case wire.EventExit:
				exit = ev
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "hi\n" || exit.ExitCode == nil || *exit.ExitCode != 3 {
		t.Fatalf("output %q, exit %+v", out.String(), exit)
	}
	calls := h.drv.Calls()
	if len(calls) < 2 || calls[len(calls)-2].Op != "Create" || calls[len(calls)-1].Op != "Delete" || calls[len(calls)-1].ID != calls[len(calls)-2].ID {
		t.Fatalf("driver calls %+v, want a Create and a Delete of one instance", calls)
	}
	// Transient: never recorded, and gone afterwards.
	h.assertClean(t)

	// A process that cannot start is the agent's error, and the sandbox
	// still goes.
	err = h.m.RunOnTree(ctx, TreeSpec{Root: root}, wire.ExecRequest{Cmd: []string{"no-such-command-xyz"}}, func(wire.ExecEvent) error { return nil })
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing command: %v", err)
	}
	h.assertClean(t)

	for _, spec := range []TreeSpec{
		{Root: "relative"},
		{Root: root, Runtime: "nope"},
		{Root: root, Limits: Limits{DiskBytes: 1 << 30}},
	} {
		if err := h.m.RunOnTree(ctx, spec, wire.ExecRequest{Cmd: []string{"true"}}, func(wire.ExecEvent) error { return nil }); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("RunOnTree(%+v) = %v, want invalid argument", spec, err)
		}
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("the fake driver wrote into the tree: %v", entries)
	}
}
