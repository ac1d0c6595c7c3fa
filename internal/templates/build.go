package templates

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/egress"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/untar"
	"github.com/corralrun/corral/internal/wire"
)

// BuildOptions are the inputs of one Build.
type BuildOptions struct {
	// File is the parsed build file (ociimage.ParseBuildFile).
	File []ociimage.Instruction
	// Context is a tar stream (plain or gzip) of the files COPY and ADD
	// read; nil means an empty context.
	Context io.Reader
	// ContextDir, if set, is a directory to read COPY and ADD sources
	// from in place of Context, which must then be nil.
	ContextDir string
	// Args are --build-arg values.
	Args map[string]string
	// ForceFrom runs the steps from this number on even when they are
	// cached (ociimage.BuildOptions.ForceFrom); 1 runs them all.
	ForceFrom int
	// Platform and Insecure apply to pulling the FROM image, as in
	// PullOptions.
	Platform string
	Insecure bool
	// Out receives one line per step, the output of RUN steps and a last
	// line saying which steps ran; nil discards them.
	Out io.Writer
	// Progress, if not nil, receives the progress of pulling the FROM
	// image.
	Progress func(ociimage.Progress)
	// Network is what RUN steps may reach; the zero value is mode none
	// (loopback only).
	Network egress.Policy
	// Service, if set, is the template's service; when it names no start
	// command, the build file's CMD and ENTRYPOINT give it. Without
	// Service, a CMD or ENTRYPOINT written in the build file becomes the
	// start command unless NoStart is set (one inherited from the FROM
	// image never does). NoStart and Service are exclusive.
	Service *sandbox.Service
	NoStart bool
}

// Build builds template name from a build file: it extracts the context
// into a temporary directory, runs ociimage.Builder with the build cache and
// a Runner that runs each RUN step in a transient sandbox on the step's
// tree, and makes the template from the result, whose configuration
// (ENV, WORKDIR, USER, ...) becomes the template's defaults and whose own
// CMD and ENTRYPOINT its service (opts.Service, opts.NoStart). Steps whose
// result is cached do not run: an unchanged rebuild costs a plan (one
// manifest request for the FROM image) and a copy of the result into the
// new template. RUN steps reach what opts.Network allows (by default
// nothing: loopback only); the policy is not part of the step cache keys.
//
// Errors: a build file the planner refuses wraps
// errdefs.ErrInvalidArgument (or ErrNotImplemented) and names the line; a
// RUN step whose command fails wraps errdefs.ErrFailedPrecondition and
// names the step, its line and the exit status; an existing name is
// errdefs.ErrAlreadyExists.
func (s *Service) Build(ctx context.Context, name string, opts BuildOptions) (sandbox.Template, error) {
	if err := s.CheckName(name); err != nil {
		return sandbox.Template{}, err
	}
	if opts.NoStart && opts.Service != nil {
		return sandbox.Template{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "no_start and a service are exclusive")
	}
	if err := checkService(opts.Service, true); err != nil {
		return sandbox.Template{}, err
	}
	ctx, end, err := s.begin(ctx)
	if err != nil {
		return sandbox.Template{}, err
	}
	defer end()
	out := logWriter(opts.Out)
	began := time.Now()
	dir := opts.ContextDir
	if dir == "" {
		tmp, err := os.MkdirTemp(s.tmpDir(), "context-")
		if err != nil {
			return sandbox.Template{}, fmt.Errorf("creating build context directory: %w", err)
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if opts.Context != nil {
		return sandbox.Template{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "a build takes a context stream or a context directory, not both")
	}
	if opts.Context != nil {
		if err := untar.ExtractTar(ctx, opts.Context, dir); err != nil {
			return sandbox.Template{}, fmt.Errorf("extracting build context: %w", err)
		}
	}
	b := &ociimage.Builder{
		Steps:  s.snaps,
		Runner: stepRunner{m: s.m, network: opts.Network},
		Resolve: func(ctx context.Context, ref string) (*ociimage.Image, error) {
			return s.cache.Pull(ctx, ref, ociimage.PullOptions{
				Platform: opts.Platform, Keychain: s.cfg.Keychain, Insecure: opts.Insecure, Progress: opts.Progress,
			})
		},
		Local: s.localBase,
	}
	res, err := b.Build(ctx, opts.File, ociimage.BuildOptions{Context: dir, Args: opts.Args, Out: out, ForceFrom: opts.ForceFrom})
	if err != nil {
		return sandbox.Template{}, err
	}
	sv, err := buildService(res, opts.Service, opts.NoStart)
	if err != nil {
		return sandbox.Template{}, err
	}
	d := sandbox.Defaults(res.Defaults)
	t := sandbox.Template{Name: name, Source: "build", Defaults: &d, Service: sv}
	for _, st := range res.Steps {
		switch st.Cmd {
		case "FROM", "RUN", "COPY", "ADD": // the steps that keep a result
			t.BuildKeys = append(t.BuildKeys, st.Key)
		}
	}
	if res.Base != nil {
		t.Image, t.Digest = res.Base.Ref, res.Base.Digest.String()
	}
	if from := fromTemplate(opts.File); from != "" {
		t.Image = "template:" + from
	}
	t, err = s.m.CreateTemplateFrom(ctx, t, func(dir string) error { return b.Export(ctx, res, dir) })
	if err != nil {
		return sandbox.Template{}, err
	}
	elapsed := time.Since(began)
	fmt.Fprintf(out, "built template %s in %s: %s\n", name, elapsed.Round(time.Millisecond), ranSummary(res))
	s.log.Info("template built", "template", name, "steps", len(res.Steps), "ran", len(res.Ran),
		"duration_ms", elapsed.Milliseconds())
	return t, nil
}

// localBase resolves a FROM of a template of the Manager
// (ociimage.Instruction.FromTemplate): its stored tree and defaults. The
// key changes when the template is made anew under the same name. A build
// starts from a template its caller sees only: another tenant's is not
// found.
func (s *Service) localBase(ctx context.Context, name string) (*ociimage.LocalBase, error) {
	t, err := s.m.Template(ctx, name)
	if err != nil {
		return nil, err
	}
	var d ociimage.Defaults
	if t.Defaults != nil {
		d = ociimage.Defaults(*t.Defaults)
	}
	return &ociimage.LocalBase{
		Key:      fmt.Sprintf("template %s %d", t.Name, t.CreatedAt.UnixNano()),
		Defaults: d,
		Fill:     func(ctx context.Context, dir string) error { return s.m.CopyTemplateTree(ctx, name, dir) },
	}, nil
}

// fromTemplate returns the template the file's FROM starts from, if any.
func fromTemplate(file []ociimage.Instruction) string {
	for _, ins := range file {
		if ins.Cmd == "FROM" {
			return ins.FromTemplate
		}
	}
	return ""
}

// ranSummary says which steps of a build ran, e.g. "ran steps 3, 4, 5 of
// 6" or "all 6 steps cached".
func ranSummary(res *ociimage.BuildResult) string {
	if len(res.Ran) == 0 {
		return fmt.Sprintf("all %d steps cached", len(res.Steps))
	}
	nums := make([]string, len(res.Ran))
	for i, n := range res.Ran {
		nums[i] = fmt.Sprint(n)
	}
	return fmt.Sprintf("ran steps %s of %d", strings.Join(nums, ", "), len(res.Steps))
}

// stepRunner implements ociimage.Runner with Manager.RunOnTree: each RUN
// step runs in a transient sandbox whose root is the step's tree, with the
// Manager's default limits and the build's network policy.
type stepRunner struct {
	m       *sandbox.Manager
	network egress.Policy
}

var _ ociimage.Runner = stepRunner{}

// Run implements ociimage.Runner.
func (r stepRunner) Run(ctx context.Context, root string, step ociimage.Step, out io.Writer) error {
	env := make(map[string]string, len(step.Env))
	for _, kv := range step.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	req := wire.ExecRequest{Cmd: step.Command, Env: env, Cwd: step.WorkingDir, User: step.User}
	var exit *wire.ExecEvent
	err := r.m.RunOnTree(ctx, sandbox.TreeSpec{Root: root, Network: r.network}, req, func(ev wire.ExecEvent) error {
		switch ev.Type {
		case wire.EventStdout, wire.EventStderr:
			_, err := out.Write(ev.Bytes())
			return err
		case wire.EventExit:
			exit = &ev
		}
		return nil
	})
	switch {
	case err != nil && exit == nil && startFailure(err):
		// What a shell reports as status 126 or 127: the step's fault,
		// not the daemon's.
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "command cannot run: %v", err)
	case err != nil:
		return err
	case exit.ExitCode != nil && *exit.ExitCode == 0:
		return nil
	case exit.OOMKilled:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "command was killed: out of memory")
	case exit.Signal != "":
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "command was killed by %s", exit.Signal)
	case exit.ExitCode != nil:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "command exited with status %d", *exit.ExitCode)
	}
	return errdefs.Errorf(errdefs.ErrInternal, "command ended without an exit status")
}

// startFailure reports whether err is the agent refusing to start a
// command (not found, not executable, bad user or working directory)
// rather than a failure of the sandbox or a canceled build.
func startFailure(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrPermissionDenied) ||
		errors.Is(err, errdefs.ErrInvalidArgument)
}
