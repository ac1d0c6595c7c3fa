package e2b

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/wire"
)

// This file turns the body of E2B's template build (the SDK's
// Template().fromImage(...).runCmd(...)... serialized) into the
// instructions of a Corral build: one instruction per E2B step, whose
// Line is the step's number, so that a failure names the step as E2B
// does ("base" for the FROM, the step's number, "finalize" for the start
// and ready commands).

// buildBody is E2B's TemplateBuildStartV2.
type buildBody struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry *registryConfig `json:"fromImageRegistry"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Force             bool            `json:"force"`
	Steps             []buildStep     `json:"steps"`
}

// registryConfig is E2B's FromImageRegistry: credentials for the base
// image's registry.
type registryConfig struct {
	Type     string `json:"type"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// buildStep is one of E2B's TemplateStep.
type buildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// stepError is a step E2B names that Corral refuses, with the step as
// E2B's build status reports it.
type stepError struct {
	step string // "base", "finalize" or a step number
	err  error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func refuseStep(step string, code error, format string, args ...any) error {
	return &stepError{step: step, err: errdefs.Errorf(code, format, args...)}
}

// filesHashPattern is what a COPY step's filesHash must look like: the
// SDK's SHA-256 in hex.
var filesHashPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// instructions returns the Corral build of body. COPY sources are read
// from the uploaded files of their hash, a directory <hash> of the build
// context (uploaded reports whether it is there).
func (b buildBody) instructions(uploaded func(hash string) bool) ([]ociimage.Instruction, error) {
	from, err := b.from()
	if err != nil {
		return nil, err
	}
	out := []ociimage.Instruction{from}
	for i, st := range b.Steps {
		n := i + 1
		ins, err := st.instruction(n, uploaded)
		if err != nil {
			return nil, &stepError{step: strconv.Itoa(n), err: err}
		}
		out = append(out, ins)
	}
	return out, nil
}

// from is the FROM of body, at line 0: an image, or a template of this
// daemon.
func (b buildBody) from() (ociimage.Instruction, error) {
	switch {
	case b.FromImage != "" && b.FromTemplate != "":
		return ociimage.Instruction{}, refuseStep("base", errdefs.ErrInvalidArgument, "fromImage and fromTemplate are exclusive")
	case b.FromImageRegistry != nil:
		return ociimage.Instruction{}, refuseStep("base", errdefs.ErrNotImplemented,
			"registry credentials (%s) are not supported by Corral's E2B API: give the daemon access to the registry (corral template pull) instead", b.FromImageRegistry.Type)
	case b.FromTemplate != "":
		if err := sandbox.ValidateTemplateName(b.FromTemplate); err != nil {
			return ociimage.Instruction{}, &stepError{step: "base", err: err}
		}
		return ociimage.Instruction{Cmd: "FROM", FromTemplate: b.FromTemplate, Text: "FROM template " + b.FromTemplate}, nil
	case b.FromImage != "":
		if strings.ContainsAny(b.FromImage, " \t\n$") {
			return ociimage.Instruction{}, refuseStep("base", errdefs.ErrInvalidArgument, "invalid image reference %q", b.FromImage)
		}
		return ociimage.Instruction{Cmd: "FROM", Args: b.FromImage, Text: "FROM " + b.FromImage}, nil
	}
	return ociimage.Instruction{}, refuseStep("base", errdefs.ErrInvalidArgument, "a template build names fromImage or fromTemplate")
}

// instruction is step number n.
func (st buildStep) instruction(n int, uploaded func(string) bool) (ociimage.Instruction, error) {
	ins := ociimage.Instruction{Line: n, Cmd: st.Type}
	args := st.Args
	switch st.Type {
	case "RUN":
		if len(args) < 1 || len(args) > 2 || strings.TrimSpace(args[0]) == "" {
			return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "RUN takes a command and an optional user")
		}
		ins.Args = args[0]
		if len(args) == 2 {
			ins.RunAs = args[1]
		}
	case "WORKDIR", "USER":
		if len(args) != 1 || args[0] == "" {
			return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s takes one argument", st.Type)
		}
		ins.Args = args[0]
		if strings.ContainsAny(args[0], " \t\n") {
			return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "%s %q: no spaces", st.Type, args[0])
		}
	case "ENV":
		if len(args) == 0 || len(args)%2 != 0 {
			return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "ENV takes name and value pairs")
		}
		var pairs []string
		for i := 0; i < len(args); i += 2 {
			if !envName.MatchString(args[i]) {
				return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "ENV: invalid variable name %q", args[i])
			}
			pairs = append(pairs, args[i]+"="+quoteWord(args[i+1]))
		}
		ins.Args = strings.Join(pairs, " ")
	case "COPY":
		return st.copyInstruction(ins, uploaded)
	default:
		return ins, errdefs.Errorf(errdefs.ErrNotImplemented, "step type %q is not supported by Corral", st.Type)
	}
	ins.Text = st.Type + " " + ins.Args
	return ins, nil
}

// envName is what an ENV step's variable names must look like.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// copyInstruction is a COPY step: args [src, dest, user, mode], src
// relative to the uploaded files of FilesHash.
func (st buildStep) copyInstruction(ins ociimage.Instruction, uploaded func(string) bool) (ociimage.Instruction, error) {
	args := append(st.Args, "", "")[:4]
	src, dest, user, mode := args[0], args[1], args[2], args[3]
	if src == "" || dest == "" {
		return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "COPY takes a source and a destination")
	}
	if !filesHashPattern.MatchString(st.FilesHash) {
		return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "COPY: filesHash %q is not a SHA-256 in hex", st.FilesHash)
	}
	if !uploaded(st.FilesHash) {
		return ins, errdefs.Errorf(errdefs.ErrFailedPrecondition, "COPY %s: its files (%s) were not uploaded", src, st.FilesHash)
	}
	clean := path.Clean("/" + src)[1:]
	if clean == "" {
		clean = "."
	}
	if user != "" {
		ins.Flags = append(ins.Flags, "--chown="+user)
	}
	if mode != "" {
		if _, err := strconv.ParseUint(mode, 8, 32); err != nil {
			return ins, errdefs.Errorf(errdefs.ErrInvalidArgument, "COPY: mode %q is not octal", mode)
		}
		ins.Flags = append(ins.Flags, "--chmod="+mode)
	}
	ins.JSON = []string{path.Join(st.FilesHash, clean), dest}
	ins.Text = fmt.Sprintf("COPY %s %s", src, dest)
	return ins, nil
}

// quoteWord quotes v for an ENV value: double quotes, with the
// characters the build file lexer treats specially escaped, except $,
// which expands as in a Dockerfile.
func quoteWord(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(v) + `"`
}

// service is the template service of body's start and ready commands:
// the start command runs in every sandbox and is not restarted, as in
// E2B; the ready command gates the create.
func (b buildBody) service() (*sandbox.Service, error) {
	if b.StartCmd == "" {
		if b.ReadyCmd != "" {
			return nil, refuseStep("finalize", errdefs.ErrInvalidArgument, "a ready command needs a start command (setStartCmd)")
		}
		return nil, nil
	}
	sv := &sandbox.Service{Shell: b.StartCmd, Restart: wire.RestartNever}
	if b.ReadyCmd != "" {
		sv.Ready = &wire.ReadyCheck{Shell: b.ReadyCmd}
	}
	if err := sandbox.ValidateService(sv); err != nil {
		return nil, &stepError{step: "finalize", err: err}
	}
	return sv, nil
}

// forceFrom is the first Corral build step to run even when cached: the
// whole build for force (skipCache before the base), else the first
// step marked force (skipCache before it; the SDK marks every later one
// too), counting the base as step 1; 0 when nothing is forced.
func (b buildBody) forceFrom() int {
	if b.Force {
		return 1
	}
	for i, st := range b.Steps {
		if st.Force {
			return i + 2
		}
	}
	return 0
}
