package ociimage

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
)

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
		if st.Number == opts.ForceFrom {
			p.force(&st)
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
	return &LineError{Line: ins.Line, Err: err, msg: fmt.Sprintf("line %d: %s: %v", ins.Line, ins.Cmd, err)}
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

// step plans one instruction: it changes the build state the
// instruction sets and computes st.Key, which the next step chains onto.
func (p *planner) step(ctx context.Context, st *Step) error {
	if st.Cmd == "FROM" {
		if p.from {
			return fmt.Errorf("multi-stage builds are not supported (one FROM per file): %w", errdefs.ErrNotImplemented)
		}
		p.from = true
		return p.fromStep(ctx, st)
	}
	var err error
	switch st.Cmd {
	case "ARG":
		err = p.planArg(st)
	case "ENV", "LABEL":
		err = p.planPairs(st)
	case "WORKDIR":
		err = p.planWorkdir(st)
	case "USER":
		err = p.planUser(st)
	case "CMD", "ENTRYPOINT":
		p.planCommand(st)
	case "RUN":
		err = p.planRun(st)
	case "COPY", "ADD":
		err = p.planCopy(st)
	default:
		return fmt.Errorf("unsupported instruction: %w", errdefs.ErrNotImplemented)
	}
	if err != nil {
		return err
	}
	p.key = st.Key
	return nil
}

// force gives step st a key no earlier build had (BuildOptions.ForceFrom):
// the step, and through the chain of keys every later one, runs again.
func (p *planner) force(st *Step) {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	old := st.Key
	st.Key = chain(old, "force", hex.EncodeToString(nonce))
	if p.key == old {
		p.key = st.Key
	}
	if p.snap == old {
		p.snap = st.Key
	}
}

// planArg declares an ARG; the key covers every ARG in scope and its value.
func (p *planner) planArg(st *Step) error {
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
	return nil
}

// planPairs sets the KEY=VALUE pairs of an ENV or LABEL.
func (p *planner) planPairs(st *Step) error {
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
	return nil
}

// planWorkdir sets the working directory, relative to the current one.
func (p *planner) planWorkdir(st *Step) error {
	w, err := p.lexer().word(st.Args)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	if !path.IsAbs(w) {
		w = path.Join(p.workdirOrRoot(), w)
	}
	p.workdir = path.Clean(w)
	st.Key = chain(p.key, "WORKDIR", p.workdir)
	return nil
}

// planUser sets the user later RUN steps and the result run as.
func (p *planner) planUser(st *Step) error {
	u, err := p.lexer().word(st.Args)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	p.user = u
	st.Key = chain(p.key, "USER", u)
	return nil
}

// planCommand sets the result's CMD or ENTRYPOINT; the shell form runs
// under /bin/sh -c.
func (p *planner) planCommand(st *Step) {
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
	p.plan.OwnCommand = true
	st.Key = chain(p.key, st.Cmd, jsonString(cmd))
}

// planRun fills in what a RUN step runs; its key covers the command and
// everything the command sees (environment, working directory, user).
func (p *planner) planRun(st *Step) error {
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
	if st.RunAs != "" {
		st.User = st.RunAs
	}
	st.Key = chain(p.key, "RUN", jsonString(st.Command), jsonString(st.Env), st.WorkingDir, st.User)
	p.treeStep(st)
	return nil
}

// planCopy resolves what a COPY or ADD copies; its key covers the content
// of the copied files, so that a changed file runs the step again.
func (p *planner) planCopy(st *Step) error {
	spec, sum, err := p.copyStep(st)
	if err != nil {
		return err
	}
	st.copy = spec
	st.WorkingDir, st.User = p.workdirOrRoot(), p.user
	st.Key = chain(p.key, st.Cmd, jsonString(spec.sources), spec.dest, spec.chown, fmt.Sprintf("%o", spec.chmod), sum, st.WorkingDir)
	p.treeStep(st)
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
	if st.FromTemplate != "" {
		return p.fromLocal(ctx, st)
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

// fromLocal starts the build from the local tree st.FromTemplate names.
func (p *planner) fromLocal(ctx context.Context, st *Step) error {
	if p.b.Local == nil {
		return fmt.Errorf("no local templates to start %s from: %w", st.FromTemplate, errdefs.ErrFailedPrecondition)
	}
	base, err := p.b.Local(ctx, st.FromTemplate)
	if err != nil {
		return err
	}
	p.plan.Local = base
	d := base.Defaults
	p.env, p.workdir, p.user = slices.Clone(d.Env), d.WorkingDir, d.User
	p.entrypoint, p.cmd, p.labels = slices.Clone(d.Entrypoint), slices.Clone(d.Cmd), maps.Clone(d.Labels)
	st.tree = true
	st.Key = chain("", "FROM", "local", base.Key)
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
