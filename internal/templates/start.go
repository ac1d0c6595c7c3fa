package templates

import (
	"slices"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
)

// checkService validates the service a pull, import or build asks for
// before the operation starts, so that a bad one fails at once rather
// than after a long pull. A build's service may leave the start command
// to the build file; allowStartless says so.
func checkService(sv *sandbox.Service, allowStartless bool) error {
	if sv == nil || !allowStartless || hasStart(sv) {
		return sandbox.ValidateService(sv)
	}
	probe := *sv
	probe.Shell = "true" // stands for the build file's command
	return sandbox.ValidateService(&probe)
}

func hasStart(sv *sandbox.Service) bool { return len(sv.Cmd) > 0 || sv.Shell != "" }

// buildService returns the service of a template built from res: sv when
// it names a start command; otherwise the command the build file itself
// sets with CMD or ENTRYPOINT (a command only inherited from the FROM
// image does not start), with sv's restart policy and ready check if sv
// is set. noStart keeps the build file's command from starting; it
// cannot be combined with sv. A service without a start command is
// errdefs.ErrInvalidArgument.
func buildService(res *ociimage.BuildResult, sv *sandbox.Service, noStart bool) (*sandbox.Service, error) {
	if noStart {
		if sv != nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "no_start and a service are exclusive")
		}
		return nil, nil
	}
	if sv != nil && hasStart(sv) {
		return sv, nil
	}
	cmd, shell := fileCommand(res.Plan)
	if len(cmd) == 0 && shell == "" {
		if sv != nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "service: a start command is required: the build file has no CMD or ENTRYPOINT")
		}
		return nil, nil
	}
	out := sandbox.Service{}
	if sv != nil {
		out = *sv
	}
	out.Cmd, out.Shell = cmd, shell
	return &out, nil
}

// fileCommand is the command a build file asks to run, as Docker runs
// it: ENTRYPOINT followed by CMD. A command that is exactly the shell
// form ("/bin/sh -c TEXT") comes back as shell text, which the agent runs
// the same way. Nothing comes back when the file has neither CMD nor
// ENTRYPOINT, whatever the FROM image's configuration says.
func fileCommand(p *ociimage.Plan) (cmd []string, shell string) {
	if p == nil || !p.OwnCommand {
		return nil, ""
	}
	argv := slices.Concat(p.Defaults.Entrypoint, p.Defaults.Cmd)
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		return nil, argv[2]
	}
	return argv, ""
}
