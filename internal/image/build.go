package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"sort"
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
	// Base is the FROM image, nil for "FROM scratch".
	Base *Image
	// Key is the snapshot key of the final tree.
	Key string
	// Defaults is the configuration of the result: the base image's,
	// changed by ENV, WORKDIR, USER, CMD, ENTRYPOINT and LABEL.
	Defaults Defaults
	// UnusedArgs lists build arguments that no ARG declared.
	UnusedArgs []string
}

// Builder builds trees from build files, keeping each step's result in
// Snapshots so that a step whose key is unchanged is never run again.
// It holds no state of its own; one Builder can run builds concurrently.
type Builder struct {
	// Snapshots keeps step results.
	Snapshots Snapshotter
	// Runner runs RUN steps; builds without RUN steps need none.
	Runner Runner
	// Resolve returns the image a FROM names (typically Cache.Pull, or
	// Cache.Image for a digest); it is not called for "FROM scratch".
	Resolve func(ctx context.Context, ref string) (*Image, error)
}

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
}

// BuildResult says what a build did.
type BuildResult struct {
	*Plan
	// Ran lists the numbers of the steps that ran (cache misses).
	Ran []int
}

// defaultPath is the PATH a RUN step gets when the image sets none, as
// Docker does.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Plan parses the meaning of a build file: it resolves the FROM image,
// expands ARG and ENV variables and hashes the files COPY and ADD read, and
// computes every step's key. It runs nothing and writes nothing. Errors
// name the line and wrap errdefs.ErrInvalidArgument (or ErrNotImplemented
// for Dockerfile features outside the subset: multi-stage builds, RUN
// flags, ADD of URLs and archives).
//
// Cost: one Resolve, and a read of every file COPY and ADD name.
func (b *Builder) Plan(ctx context.Context, file []Instruction, opts BuildOptions) (*Plan, error) {
	p := &planner{b: b, opts: opts, meta: map[string]string{}, args: map[string]*string{}, used: map[string]bool{}}
	defer p.close()
	i := 0
	for ; i < len(file) && file[i].Cmd == "ARG"; i++ {
		if err := p.arg(file[i], true); err != nil {
			return nil, lineError(file[i], err)
		}
	}
	if i == len(file) || file[i].Cmd != "FROM" {
		line := 1
		if i < len(file) {
			line = file[i].Line
		}
		return nil, fmt.Errorf("line %d: a build file starts with FROM (after ARGs only): %w", line, errdefs.ErrInvalidArgument)
	}
	steps := file[i:]
	for n, ins := range steps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st := Step{Number: n + 1, Total: len(steps), Instruction: ins}
		if err := p.step(ctx, &st); err != nil {
			return nil, lineError(ins, err)
		}
		p.plan.Steps = append(p.plan.Steps, st)
	}
	p.plan.Key = p.snap
	p.plan.Defaults = Defaults{
		Env: p.env, WorkingDir: p.workdir, User: p.user,
		Entrypoint: p.entrypoint, Cmd: p.cmd, Labels: p.labels,
	}
	for k := range opts.Args {
		if !p.used[k] {
			p.plan.UnusedArgs = append(p.plan.UnusedArgs, k)
		}
	}
	sort.Strings(p.plan.UnusedArgs)
	return &p.plan, nil
}

func lineError(ins Instruction, err error) error {
	return fmt.Errorf("line %d: %s: %w", ins.Line, ins.Cmd, err)
}

// planner holds the build state while Plan walks the file.
type planner struct {
	b    *Builder
	opts BuildOptions
	plan Plan

	meta map[string]string  // ARGs before FROM
	args map[string]*string // ARGs in scope; nil means declared without a value
	used map[string]bool    // build arguments an ARG declared

	env        []string
	workdir    string
	user       string
	entrypoint []string
	cmd        []string
	labels     map[string]string

	key  string // key after the last step
	snap string // key of the last snapshot
	from bool

	ctxRoot *os.Root
}

func (p *planner) close() {
	if p.ctxRoot != nil {
		p.ctxRoot.Close()
	}
}

// lookup resolves a variable for expansion: ENV wins over ARG, as in
// Docker.
func (p *planner) lookup(name string) (string, bool) {
	for i := len(p.env) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(p.env[i], "="); k == name {
			return v, true
		}
	}
	if v, ok := p.args[name]; ok && v != nil {
		return *v, true
	}
	return "", false
}

func (p *planner) lexer() lexer { return lexer{lookup: p.lookup} }

// runEnv is the environment of a RUN step: ENV, then ARG values not
// shadowed by ENV, then a default PATH if neither sets one.
func (p *planner) runEnv() []string {
	env := slices.Clone(p.env)
	names := slices.Sorted(maps.Keys(p.args))
	for _, k := range names {
		v := p.args[k]
		if v == nil {
			continue
		}
		if _, inEnv := p.envValue(k); !inEnv {
			env = append(env, k+"="+*v)
		}
	}
	if _, ok := envLookup(env, "PATH"); !ok {
		env = append(env, defaultPath)
	}
	return env
}

func (p *planner) envValue(name string) (string, bool) { return envLookup(p.env, name) }

func envLookup(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(env[i], "="); k == name {
			return v, true
		}
	}
	return "", false
}

// chain hashes a step onto the key before it.
func chain(parent string, parts ...string) string {
	h := sha256.New()
	io.WriteString(h, "corral-build-v1\x00"+parent+"\x00")
	for _, s := range parts {
		io.WriteString(h, s+"\x00")
	}
	return hex.EncodeToString(h.Sum(nil))
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func (p *planner) step(ctx context.Context, st *Step) error {
	if st.Cmd == "FROM" {
		if p.from {
			return fmt.Errorf("multi-stage builds are not supported (one FROM per file): %w", errdefs.ErrNotImplemented)
		}
		p.from = true
		return p.fromStep(ctx, st)
	}
	switch st.Cmd {
	case "ARG":
		if err := p.arg(st.Instruction, false); err != nil {
			return err
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(p.args)) {
			if v := p.args[k]; v != nil {
				parts = append(parts, k+"="+*v)
			} else {
				parts = append(parts, k)
			}
		}
		st.Key = chain(p.key, "ARG", jsonString(parts))
	case "ENV", "LABEL":
		pairs, err := p.pairs(st.Instruction)
		if err != nil {
			return err
		}
		for _, kv := range pairs {
			k, v, _ := strings.Cut(kv, "=")
			if st.Cmd == "ENV" {
				p.env = MergeEnv(p.env, []string{kv})
			} else {
				if p.labels == nil {
					p.labels = map[string]string{}
				}
				p.labels[k] = v
			}
		}
		st.Key = chain(p.key, st.Cmd, jsonString(pairs))
	case "WORKDIR":
		w, err := p.lexer().word(st.Args)
		if err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		if !path.IsAbs(w) {
			w = path.Join(p.workdirOrRoot(), w)
		}
		p.workdir = path.Clean(w)
		st.Key = chain(p.key, "WORKDIR", p.workdir)
	case "USER":
		u, err := p.lexer().word(st.Args)
		if err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		p.user = u
		st.Key = chain(p.key, "USER", u)
	case "CMD", "ENTRYPOINT":
		cmd := st.JSON
		if cmd == nil && st.Args != "" {
			cmd = []string{"/bin/sh", "-c", st.Args}
		}
		if st.Cmd == "CMD" {
			p.cmd = cmd
		} else {
			// Docker: setting ENTRYPOINT resets a CMD inherited from the
			// base image.
			p.entrypoint, p.cmd = cmd, nil
		}
		st.Key = chain(p.key, st.Cmd, jsonString(cmd))
	case "RUN":
		if len(st.Flags) > 0 {
			return fmt.Errorf("flag %s is not supported: %w", st.Flags[0], errdefs.ErrNotImplemented)
		}
		st.Command = st.JSON
		if st.Command == nil {
			st.Command = []string{"/bin/sh", "-c", st.Args}
		}
		if len(st.Command) == 0 {
			return fmt.Errorf("empty command: %w", errdefs.ErrInvalidArgument)
		}
		st.Env, st.WorkingDir, st.User = p.runEnv(), p.workdirOrRoot(), p.user
		st.Key = chain(p.key, "RUN", jsonString(st.Command), jsonString(st.Env), st.WorkingDir, st.User)
		p.treeStep(st)
	case "COPY", "ADD":
		spec, sum, err := p.copyStep(st)
		if err != nil {
			return err
		}
		st.copy = spec
		st.WorkingDir, st.User = p.workdirOrRoot(), p.user
		st.Key = chain(p.key, st.Cmd, jsonString(spec.sources), spec.dest, spec.chown, fmt.Sprintf("%o", spec.chmod), sum, st.WorkingDir)
		p.treeStep(st)
	default:
		return fmt.Errorf("unsupported instruction: %w", errdefs.ErrNotImplemented)
	}
	p.key = st.Key
	return nil
}

func (p *planner) workdirOrRoot() string {
	if p.workdir == "" {
		return "/"
	}
	return p.workdir
}

func (p *planner) treeStep(st *Step) {
	st.tree, st.parent = true, p.snap
	p.snap = st.Key
}

func (p *planner) fromStep(ctx context.Context, st *Step) error {
	if len(st.Flags) > 0 {
		return fmt.Errorf("flag %s is not supported: %w", st.Flags[0], errdefs.ErrNotImplemented)
	}
	words, err := lexer{lookup: func(k string) (string, bool) { v, ok := p.meta[k]; return v, ok }}.words(st.Args)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(words) != 1 && !(len(words) == 3 && strings.EqualFold(words[1], "AS")) {
		return fmt.Errorf("want FROM <image> [AS <name>]: %w", errdefs.ErrInvalidArgument)
	}
	ref := words[0]
	st.tree = true
	if ref == "scratch" {
		st.Key = chain("", "FROM", "scratch")
	} else {
		if p.b.Resolve == nil {
			return fmt.Errorf("no image resolver to fetch %s: %w", ref, errdefs.ErrFailedPrecondition)
		}
		img, err := p.b.Resolve(ctx, ref)
		if err != nil {
			return err
		}
		p.plan.Base = img
		d := img.Defaults()
		p.env, p.workdir, p.user = d.Env, d.WorkingDir, d.User
		p.entrypoint, p.cmd, p.labels = d.Entrypoint, d.Cmd, d.Labels
		st.Key = chain("", "FROM", img.Digest.String())
	}
	p.key, p.snap = st.Key, st.Key
	return nil
}

// arg declares the variables of an ARG instruction; before FROM they are
// only for FROM itself.
func (p *planner) arg(ins Instruction, meta bool) error {
	words, err := p.lexer().words(ins.Args)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	for _, w := range words {
		name, def, hasDef := strings.Cut(w, "=")
		if name == "" || !validName(name) {
			return fmt.Errorf("bad ARG name %q: %w", name, errdefs.ErrInvalidArgument)
		}
		var val *string
		switch v, ok := p.opts.Args[name]; {
		case ok:
			val = &v
			p.used[name] = true
		case hasDef:
			val = &def
		case !meta:
			// "ARG NAME" in the stage takes the value of an ARG before
			// FROM.
			if mv, ok := p.meta[name]; ok {
				val = &mv
			}
		}
		if meta {
			if val != nil {
				p.meta[name] = *val
			}
			continue
		}
		p.args[name] = val
	}
	return nil
}

func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i], i == 0) {
			return false
		}
	}
	return s != ""
}

// pairs parses "k=v k2=v2" or the legacy "k v" form of ENV and LABEL.
func (p *planner) pairs(ins Instruction) ([]string, error) {
	words, err := p.lexer().words(ins.Args)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(words) == 0 {
		return nil, fmt.Errorf("no variables: %w", errdefs.ErrInvalidArgument)
	}
	if !strings.Contains(words[0], "=") {
		// Legacy form: the first word is the name, the rest the value.
		if len(words) == 1 {
			return nil, fmt.Errorf("%s %s has no value: %w", ins.Cmd, words[0], errdefs.ErrInvalidArgument)
		}
		return []string{words[0] + "=" + strings.Join(words[1:], " ")}, nil
	}
	for _, w := range words {
		k, _, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not NAME=value: %w", w, errdefs.ErrInvalidArgument)
		}
		if ins.Cmd == "ENV" && !validName(k) {
			return nil, fmt.Errorf("bad variable name %q: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	return words, nil
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
	if b.Snapshots == nil {
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
		ok, err := b.Snapshots.Has(ctx, plan.Steps[i].Key)
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
			return nil, fmt.Errorf("step %d/%d (line %d) %s: %w", st.Number, st.Total, st.Line, st.Cmd, err)
		}
		fmt.Fprintf(out, "step %d/%d done in %s\n", st.Number, st.Total, time.Since(began).Round(time.Millisecond))
		res.Ran = append(res.Ran, st.Number)
	}
	return res, nil
}

// runStep runs one tree step on a copy of its parent and commits it.
func (b *Builder) runStep(ctx context.Context, st *Step, plan *Plan, opts BuildOptions, out io.Writer) error {
	dir, err := b.Snapshots.Prepare(ctx, st.parent)
	if err != nil {
		return err
	}
	if err := b.apply(ctx, dir, st, plan, opts, out); err != nil {
		if aerr := b.Snapshots.Abort(context.WithoutCancel(ctx), dir); aerr != nil {
			return errors.Join(err, fmt.Errorf("discarding the step's tree: %w", aerr))
		}
		return err
	}
	return b.Snapshots.Commit(ctx, dir, st.Key)
}

func (b *Builder) apply(ctx context.Context, dir string, st *Step, plan *Plan, opts BuildOptions, out io.Writer) error {
	switch st.Cmd {
	case "FROM":
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
	if err := b.Snapshots.Export(ctx, res.Key, dir); err != nil {
		return err
	}
	if res.Defaults.WorkingDir != "" {
		return ensureDir(dir, res.Defaults.WorkingDir)
	}
	return nil
}
