package ociimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
)

// Runner runs the RUN steps of a build. The daemon implements it with a
// sandbox whose root filesystem is the step's tree and whose network
// follows the build's policy; tests use a fake.
type Runner interface {
	// Run runs step.Command with step.Env, step.WorkingDir and step.User
	// in a sandbox whose writable root filesystem is the directory root,
	// and streams the command's output to out. It returns when the
	// command has exited and nothing runs in root any more; a command
	// that fails returns an error (wrapping errdefs.ErrFailedPrecondition
	// for a non-zero exit). The changes it leaves in root are the step's
	// result.
	Run(ctx context.Context, root string, step Step, out io.Writer) error
}

// Step is one instruction of a planned build.
type Step struct {
	// Number counts instructions from FROM, from 1; Total is how many
	// there are.
	Number, Total int
	Instruction
	// Key is the cache key of the build's state after this step: a hash
	// of the previous step's key and of everything this step depends on
	// (its arguments after expansion, the effective ENV and ARG values,
	// working directory and user, and for COPY and ADD the content of the
	// copied files). Steps that change the tree (FROM, RUN, COPY, ADD)
	// keep their result as a snapshot under Key.
	Key string
	// Command, Env, WorkingDir and User say what a RUN step runs: Command
	// is ["/bin/sh", "-c", text] for the shell form. Env holds the ENV
	// variables and the ARG values in scope.
	Command    []string
	Env        []string
	WorkingDir string
	User       string

	tree   bool   // the step changes the tree and has a snapshot
	parent string // key of the snapshot the step starts from
	copy   *copySpec
}

// copySpec is what a COPY or ADD step copies.
type copySpec struct {
	sources []string // clean paths in the context, globs expanded
	dest    string   // absolute, as written (a trailing slash matters)
	chown   string
	chmod   os.FileMode
}

// Plan is a build file with every step's key computed, ready to run.
type Plan struct {
	Steps []Step
	// Base is the FROM image, nil for "FROM scratch" and for a local base.
	Base *Image
	// Local is the FROM tree of Instruction.FromTemplate, or nil.
	Local *LocalBase
	// Key is the snapshot key of the final tree.
	Key string
	// Defaults is the configuration of the result: the base image's,
	// changed by ENV, WORKDIR, USER, CMD, ENTRYPOINT and LABEL.
	Defaults Defaults
	// OwnCommand is true when the build file itself has a CMD or an
	// ENTRYPOINT, so that Defaults.Entrypoint and Defaults.Cmd say what
	// the file asks to run rather than only what the FROM image did.
	OwnCommand bool
	// UnusedArgs lists build arguments that no ARG declared.
	UnusedArgs []string
}

// Builder builds trees from build files, keeping each step's result in
// Steps so that a step whose key is unchanged is never run again.
// It holds no state of its own; one Builder can run builds concurrently.
type Builder struct {
	// Steps keeps step results.
	Steps StepCache
	// Runner runs RUN steps; builds without RUN steps need none.
	Runner Runner
	// Resolve returns the image a FROM names (typically Cache.Pull, or
	// Cache.Image for a digest); it is not called for "FROM scratch".
	Resolve func(ctx context.Context, ref string) (*Image, error)
	// Local resolves Instruction.FromTemplate; nil refuses such a FROM.
	Local func(ctx context.Context, name string) (*LocalBase, error)
}

// LocalBase is a tree of this host that a build starts from instead of
// an image (a template of the daemon's).
type LocalBase struct {
	// Key identifies the tree's content: a changed tree has another key,
	// so that the steps after it run again.
	Key string
	// Defaults are the tree's run settings, which later steps change.
	Defaults Defaults
	// Fill copies the tree into dir, an existing empty directory.
	Fill func(ctx context.Context, dir string) error
}

// LineError is the error of one instruction of a build, planned or run.
// Line is the instruction's Line.
type LineError struct {
	Line int
	Err  error
	msg  string
}

func (e *LineError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("line %d: %v", e.Line, e.Err)
	}
	return e.msg
}
func (e *LineError) Unwrap() error { return e.Err }

// BuildOptions are the inputs of one build besides the file.
type BuildOptions struct {
	// Context is the directory COPY and ADD read from. Nothing outside it
	// can be copied, through ".." or symlinks.
	Context string
	// Args are --build-arg values; they override ARG defaults.
	Args map[string]string
	// Out receives one line per step and the output of RUN steps; nil
	// discards them.
	Out io.Writer
	// ForceFrom, if not 0, is the number of the first step to run even
	// when its result is cached (1 runs every step, as docker build
	// --no-cache does): that step's key gets a part of its own, so it and
	// every later step make new results; the earlier ones stay cached.
	ForceFrom int
}

// BuildResult says what a build did.
type BuildResult struct {
	*Plan
	// Ran lists the numbers of the steps that ran (cache misses).
	Ran []int
}

// Build plans the file and runs the steps whose results are not cached:
// it finds the last step whose snapshot exists and runs only the steps
// after it, each on a copy of the previous step's tree, committing each
// result under its key. An unchanged rebuild therefore runs nothing and
// costs a Plan and one Has; a change in step N runs steps N and later that
// change the tree. A failed step leaves no snapshot and the error names its
// number and line; the steps before it stay cached.
//
// Use Export to fill a template from the result.
func (b *Builder) Build(ctx context.Context, file []Instruction, opts BuildOptions) (*BuildResult, error) {
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	if b.Steps == nil {
		return nil, fmt.Errorf("builder has no snapshot store: %w", errdefs.ErrFailedPrecondition)
	}
	plan, err := b.Plan(ctx, file, opts)
	if err != nil {
		return nil, err
	}
	for _, a := range plan.UnusedArgs {
		fmt.Fprintf(out, "warning: build argument %s is not declared by any ARG\n", a)
	}
	// Everything up to the last snapshot that exists is cached; the
	// snapshots before it are not needed.
	start := 0
	for i := len(plan.Steps) - 1; i >= 0; i-- {
		if !plan.Steps[i].tree {
			continue
		}
		ok, err := b.Steps.Has(ctx, plan.Steps[i].Key)
		if err != nil {
			return nil, fmt.Errorf("looking up build cache: %w", err)
		}
		if ok {
			start = i + 1
			break
		}
	}
	res := &BuildResult{Plan: plan}
	for i := range plan.Steps {
		st := &plan.Steps[i]
		if i < start || !st.tree {
			cached := ""
			if st.tree {
				cached = " (cached)"
			}
			fmt.Fprintf(out, "step %d/%d: %s%s\n", st.Number, st.Total, st.Text, cached)
			continue
		}
		fmt.Fprintf(out, "step %d/%d: %s\n", st.Number, st.Total, st.Text)
		began := time.Now()
		if err := b.runStep(ctx, st, plan, opts, out); err != nil {
			return nil, &LineError{Line: st.Line, Err: err,
				msg: fmt.Sprintf("step %d/%d (line %d) %s: %v", st.Number, st.Total, st.Line, st.Cmd, err)}
		}
		fmt.Fprintf(out, "step %d/%d done in %s\n", st.Number, st.Total, time.Since(began).Round(time.Millisecond))
		res.Ran = append(res.Ran, st.Number)
	}
	return res, nil
}

// runStep runs one tree step on a copy of its parent and commits it.
func (b *Builder) runStep(ctx context.Context, st *Step, plan *Plan, opts BuildOptions, out io.Writer) error {
	dir, err := b.Steps.Prepare(ctx, st.parent)
	if err != nil {
		return err
	}
	if err := b.apply(ctx, dir, st, plan, opts, out); err != nil {
		if aerr := b.Steps.Abort(context.WithoutCancel(ctx), dir); aerr != nil {
			return errors.Join(err, fmt.Errorf("discarding the step's tree: %w", aerr))
		}
		return err
	}
	return b.Steps.Commit(ctx, dir, st.Key)
}

func (b *Builder) apply(ctx context.Context, dir string, st *Step, plan *Plan, opts BuildOptions, out io.Writer) error {
	switch st.Cmd {
	case "FROM":
		if plan.Local != nil {
			return plan.Local.Fill(ctx, dir)
		}
		if plan.Base == nil {
			return nil
		}
		return plan.Base.Unpack(ctx, dir)
	case "RUN":
		if b.Runner == nil {
			return fmt.Errorf("no runner for RUN steps: %w", errdefs.ErrFailedPrecondition)
		}
		if err := ensureDir(dir, st.WorkingDir); err != nil {
			return err
		}
		return b.Runner.Run(ctx, dir, *st, out)
	case "COPY", "ADD":
		if err := ensureDir(dir, st.WorkingDir); err != nil {
			return err
		}
		return copyIn(ctx, dir, st.copy, opts.Context)
	}
	return fmt.Errorf("step %s does not change the tree", st.Cmd)
}

// ensureDir makes the directory p (absolute in the tree at dir) if it is
// missing, as WORKDIR does in Docker.
func ensureDir(dir, p string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	rel := strings.TrimLeft(path.Clean(p), "/")
	if rel == "" {
		return nil
	}
	if err := root.MkdirAll(rel, 0o755); err != nil {
		return fmt.Errorf("creating working directory %s: %w", p, err)
	}
	return nil
}

// Export copies the result of a build into dir, an existing empty
// directory, typically the one a storage backend's CreateTemplate hands
// to its fill function. It costs a copy of the tree (a clone of it on
// filesystems that share extents).
func (b *Builder) Export(ctx context.Context, res *BuildResult, dir string) error {
	if err := b.Steps.Export(ctx, res.Key, dir); err != nil {
		return err
	}
	if res.Defaults.WorkingDir != "" {
		return ensureDir(dir, res.Defaults.WorkingDir)
	}
	return nil
}
