package agentserver

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/corralrun/corral/internal/seccomp"
	"golang.org/x/sys/unix"
)

// confinement is what confine puts in place: a seccomp program (base64),
// given in filter or read from the file filterFile, and FILE=VALUE lines
// of limits, given in limits or read from the file limitsFile. Empty ones
// are left out.
type confinement struct {
	filter, filterFile string
	limits, limitsFile string
	oneThread          bool
}

// confinementOf is the confinement that flags f ask for. A program or
// limits passed in the environment (--seccomp-env, --limits-env) are
// taken out of it, so that nothing the agent runs later sees them.
func confinementOf(f agentFlags) confinement {
	c := confinement{filter: f.filter, filterFile: f.filterFile, limitsFile: f.limits, oneThread: f.oneThread}
	if f.filterEnv != "" {
		c.filter = takeEnv(f.filterEnv)
	}
	if f.limitsEnv != "" {
		c.limits = takeEnv(f.limitsEnv)
	}
	return c
}

// takeEnv returns the value of the environment variable name and removes
// the variable.
func takeEnv(name string) string {
	v := os.Getenv(name)
	os.Unsetenv(name)
	return v
}

// confine makes the agent not dumpable, installs c's seccomp program,
// then writes c's limits. None of the sandbox's processes ever runs
// without the filter or the limits.
//
// confine returns at once, and the work goes on beside the caller's:
// confined returns its result, and the caller must have it before it
// serves or starts anything. By default the filter goes on every thread of
// the agent (TSYNC), threads made later inherit it, and the filter is
// installed and limits written while the caller builds its server, so
// that neither waits for the other. With c.oneThread (--spawn-thread)
// confine starts a spawner instead, whose first thread installs the filter
// on itself alone, writes the limits, and then starts processes (with
// threads it adds as needed, each filtered first). gVisor sandboxes use it
// (see spawner for why); under runc it would only add a thread switch to
// every exec.
func confine(c confinement, log *slog.Logger) (spawn *spawner, confined func() error, err error) {
	// Not dumpable: the sandbox's processes, which run as the agent's user
	// (or, without user namespaces, as a root that may override file
	// modes), cannot open the agent's descriptors through /proc/1/fd, such
	// as its log on the host (in the run dir, a tmpfs), nor read its
	// memory or environment. What the agent starts is dumpable again after
	// its execve.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, nil, fmt.Errorf("making the agent not dumpable: %w", err)
	}
	var prog []unix.SockFilter
	setup := func(install func([]unix.SockFilter) error) error {
		filter := c.filter
		if c.filterFile != "" {
			b, err := os.ReadFile(c.filterFile)
			if err != nil {
				return err
			}
			filter = string(b)
		}
		if filter != "" {
			var err error
			if prog, err = seccomp.Decode(filter); err != nil {
				return err
			}
			if err := install(prog); err != nil {
				return err
			}
		}
		limits := c.limits
		if c.limitsFile != "" {
			b, err := os.ReadFile(c.limitsFile)
			if err != nil {
				return fmt.Errorf("reading limits: %w", err)
			}
			limits = string(b)
		}
		return writeLimits(limits)
	}
	if c.oneThread {
		// Threads added later install the program the first decoded,
		// which setup has done before any start can add one.
		more := func() error {
			if prog == nil {
				return nil
			}
			return seccomp.InstallThread(prog)
		}
		failed := func(err error) { log.Warn("adding a thread to start processes", "error", err) }
		spawn = startSpawner(func() error { return setup(seccomp.InstallThread) }, more, failed)
		return spawn, spawn.wait, nil
	}
	// Unwaited only when start-up fails before confined: the agent
	// exits then, and the goroutine with it.
	done := make(chan error, 1)
	go func() { done <- setup(seccomp.Install) }()
	return nil, func() error { return <-done }, nil
}

// writeLimits writes each FILE=VALUE line of limits (--limits,
// --limits-env).
func writeLimits(limits string) error {
	for line := range strings.Lines(limits) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		file, value, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(file, "/") {
			return fmt.Errorf("limits: want absolute FILE=VALUE lines, got %q", line)
		}
		if err := os.WriteFile(file, []byte(value), 0); err != nil {
			return fmt.Errorf("writing limit: %w", err)
		}
	}
	return nil
}

// rlimit is one resource limit of --rlimit, soft and hard alike.
type rlimit struct {
	name     string
	resource int
	value    uint64
}

// rlimitNames are the limits --rlimit knows, by their OCI names.
var rlimitNames = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING, "RLIMIT_STACK": unix.RLIMIT_STACK,
}

// parseRlimit parses RLIMIT_NAME=VALUE.
func parseRlimit(s string) (rlimit, error) {
	name, v, ok := strings.Cut(s, "=")
	res, known := rlimitNames[name]
	if !ok || !known {
		return rlimit{}, fmt.Errorf("want RLIMIT_NAME=VALUE with a known name, got %q", s)
	}
	value, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return rlimit{}, fmt.Errorf("limit %s: %w", name, err)
	}
	return rlimit{name, res, value}, nil
}

// set sets the limit on the agent, which every process it starts
// inherits. Lowering a limit needs no privilege, and nothing in the
// sandbox can raise it again: that takes CAP_SYS_RESOURCE in the host's
// user namespace. syscall.Setrlimit, not unix's: for RLIMIT_NOFILE it
// also stops the Go runtime from restoring the limit it found at start in
// the processes it forks.
func (r rlimit) set() error {
	lim := syscall.Rlimit{Cur: r.value, Max: r.value}
	if err := syscall.Setrlimit(r.resource, &lim); err != nil {
		return fmt.Errorf("setting %s to %d: %w", r.name, r.value, err)
	}
	return nil
}
