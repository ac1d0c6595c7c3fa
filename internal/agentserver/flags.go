package agentserver

import (
	"flag"
	"os"

	"github.com/corralrun/corral/internal/vmguest"
)

// agentFlags are the agent's command-line flags (see the package
// documentation for the contract with drivers).
type agentFlags struct {
	listenFD   int
	readyFD    int
	dial       string
	filter     string
	filterFile string
	filterEnv  string
	oneThread  bool
	limits     string
	limitsEnv  string
	rlimits    []rlimit
	vm         bool
	vmOpts     vmguest.Options
}

// parseFlags parses args; the flag package has already reported an error
// on stderr when it returns one.
func parseFlags(args []string) (agentFlags, error) {
	var f agentFlags
	fl := flag.NewFlagSet("corral agent", flag.ContinueOnError)
	fl.SetOutput(os.Stderr)
	fl.IntVar(&f.listenFD, "listen-fd", -1, "inherited `fd` of a listening stream socket to serve on")
	fl.IntVar(&f.readyFD, "ready-fd", -1, "inherited `fd` to write \"ok\" (or \"error: ...\") to once ready")
	fl.StringVar(&f.dial, "dial", "", "unix socket or character device (a virtio-serial port) `path` to dial and serve over, instead of --listen-fd (gVisor, VMs)")
	fl.BoolVar(&f.vm, "vm", false, "run as PID 1 of a VM from the initramfs the VM driver built: load its modules, mount the root disk and switch into it first")
	fl.StringVar(&f.vmOpts.Hostname, "hostname", "", "with --vm, the `name` to set as the host name")
	fl.Int64Var(&f.vmOpts.MemoryBytes, "memory", 0, "with --vm, the memory limit in `bytes` of everything the agent starts (0: none)")
	fl.Int64Var(&f.vmOpts.Pids, "pids", 0, "with --vm, the `number` of tasks the agent and what it starts may have (0: no limit)")
	fl.Func("net", "with --vm, `ADDR/BITS,GATEWAY[,MTU]`: the IPv4 address of the VM's network device and its default route (none: loopback only)", func(s string) error {
		n, err := vmguest.ParseNetwork(s)
		f.vmOpts.Net = &n
		return err
	})
	fl.StringVar(&f.filter, "seccomp", "", "seccomp `program` (base64) to install on the agent, or with --spawn-thread on the thread that starts processes, and so on everything it starts, before it serves")
	fl.StringVar(&f.filterFile, "seccomp-file", "", "`file` holding the program of --seccomp, for an argv that must not change (gVisor restores a checkpoint only into the same one)")
	fl.StringVar(&f.filterEnv, "seccomp-env", "", "environment `variable` holding the program of --seccomp, which the agent then removes from its environment: an argv that does not change, at no file read")
	fl.BoolVar(&f.oneThread, "spawn-thread", false, "start every process from one thread that alone carries the --seccomp filter, instead of filtering every thread (gVisor, where a filter costs per thread)")
	fl.StringVar(&f.limits, "limits", "", "`file` of FILE=VALUE lines, each a file to write before serving, such as a cgroup limit inside gVisor")
	fl.StringVar(&f.limitsEnv, "limits-env", "", "environment `variable` holding the lines of --limits, which the agent then removes from its environment")
	fl.Func("rlimit", "`RLIMIT_NAME=VALUE`: lower that resource limit, soft and hard, before serving, for every process the agent starts (repeatable)", func(s string) error {
		r, err := parseRlimit(s)
		f.rlimits = append(f.rlimits, r)
		return err
	})
	err := fl.Parse(args)
	return f, err
}
