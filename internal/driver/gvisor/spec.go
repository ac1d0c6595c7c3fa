package gvisor

import (
	"path"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/driver/runc"
)

// agentArgs is the argv of the sandbox's init: the agent, dialing the
// daemon's socket (see package agentserver), starting processes from the
// one thread that carries the seccomp filter (spawnThreadFlag): in gVisor
// a filter costs per thread that has it, and writing the limits it finds
// in its environment inside gVisor before it serves.
var agentArgs = []string{runc.AgentDest, "agent", "--dial=" + path.Join(RunDest, socketFile), spawnThreadFlag, "--limits-env=" + limitsEnv}

const spawnThreadFlag = "--spawn-thread"

// The environment variables that carry the limits to write inside gVisor
// (innerLimitFiles, as limitLines) and the seccomp program to the agent,
// which removes them from its environment once read. The environment,
// unlike the argv, may differ between a checkpoint and its restore, and a
// variable costs the agent no round trip to the gofer, as a file would.
const (
	limitsEnv  = "CORRAL_AGENT_LIMITS"
	seccompEnv = "CORRAL_AGENT_SECCOMP"
)

// ociSpec returns the OCI runtime configuration of sandbox s: the runc
// driver's (the same capabilities, seccomp profile, rlimits, mounts and
// ID mapping u, which runsc applies inside gVisor), with the agent dialing
// out through runDir, mounted read-only at RunDest, and finding in its
// environment the limits to write inside gVisor before it serves and,
// when h.InitSeccomp is set, the seccomp program to install first. The
// argv is the same for every sandbox, whatever its limits or the daemon's
// profile, as restoring a checkpoint into another sandbox needs. It is a
// pure function of its arguments.
func ociSpec(s driver.Spec, h runc.Host, u runc.UserNS, runDir string) *specs.Spec {
	spec := runc.OCISpec(s, h, u)
	spec.Process.Args = slices.Clone(agentArgs)
	spec.Process.Env = append(spec.Process.Env, limitsEnv+"="+limitLines(innerLimitFiles(s.Resources, false)))
	if h.InitSeccomp != "" {
		spec.Process.Args = append(spec.Process.Args, "--seccomp-env="+seccompEnv)
		spec.Process.Env = append(spec.Process.Env, seccompEnv+"="+h.InitSeccomp)
	}
	// runc leaves them to the runc driver in a user namespace; gVisor
	// applies them itself.
	spec.Process.Rlimits = runc.Rlimits(h)
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: RunDest, Type: "bind", Source: runDir,
		Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	if n := s.Network; n != nil {
		joinNetNS(spec, n.NetNSPath)
	}
	if sc := spec.Linux.Seccomp; sc != nil {
		sc.Syscalls = slices.DeleteFunc(sc.Syscalls, notEPERM)
	}
	return spec
}

// notEPERM reports whether rule asks for an errno other than EPERM.
// gVisor applies the spec's seccomp profile (--oci-seccomp) but answers
// every SCMP_ACT_ERRNO rule with EPERM, whatever its errnoRet, so such a
// rule is left out rather than changed. The one there is, clone3 ->
// ENOSYS, exists to make glibc fall back to clone(2), whose namespace
// flags seccomp can see: with EPERM glibc does not fall back and cannot
// start threads, and namespaces made inside gVisor are gVisor's own.
func notEPERM(rule specs.LinuxSyscall) bool {
	return rule.Action == specs.ActErrno && rule.ErrnoRet != nil && *rule.ErrnoRet != uint(unix.EPERM)
}

// joinNetNS makes the sandbox join the network namespace at p. runsc joins
// it from the host's user namespace, where it may, so unlike runc in a
// user namespace it needs no help: "path: [...] the runtime MUST place the
// container process in the namespace associated with that path."
func joinNetNS(spec *specs.Spec, p string) {
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = p
			return
		}
	}
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: p})
}
