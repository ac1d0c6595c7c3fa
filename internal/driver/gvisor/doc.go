// Package gvisor is the gVisor driver: each sandbox is a runsc sandbox
// whose Sentry (a user-space kernel) runs the agent and everything it
// starts, so code in the sandbox makes its system calls to gVisor, never to
// the host kernel. The platform is systrap by default.
//
// The driver owns, for each sandbox, a directory <Root>/sandboxes/<id>
// (OCI bundle config.json, the agent's output agent.log, the sandbox
// process's pid file, and run/, the directory of the agent's socket),
// runsc's state under <Root>/state, the sandbox's host cgroup, and one
// agentdialout.Listener. It never deletes the sandbox's root file system.
// Like the runc driver it does not persist records, schedule or retry;
// the Manager reconciles with List, Status and Delete.
//
// # Agent transport
//
// gVisor cannot accept(2) on a listening socket passed in from the host,
// so the agent dials out: the driver listens on <box>/run/agent.sock (see
// box.go), the directory is bind-mounted read-only at /.corral/run, runsc
// runs with --host-uds=open so that the sandbox may connect to host
// sockets it can see, and the agent runs `corral agent
// --dial=/.corral/run/agent.sock`. One yamux session carries every stream
// (package agentdialout); the agent client keeps its HTTP connections, and so
// its streams, alive between requests, so a request costs no stream set-up.
// The agent dials again whenever the session breaks, so a daemon restart
// (New listens again for every sandbox) and a restore from a checkpoint (a
// fresh listener in the new sandbox's box) both end with the agent
// connected to the right daemon. gVisor does not keep host socket
// connections across a save, and after a checkpoint that leaves the
// sandbox running neither end notices until the next keep-alive: the
// driver drops the session and signals the agent (SIGHUP) to dial at once.
// Only the sandbox can reach its socket, so an impostor agent is the
// sandbox's own root lying about itself, no more than it can with the
// runc driver.
//
// # Resources
//
// The host cgroup of a sandbox holds the Sentry, the gofer and the
// systrap stub processes as well as the workload's memory, so the driver
// creates it itself, before runsc, with more than the sandbox asked for
// (runsc uses a cgroup that exists and leaves its settings alone):
// memory and memory+swap get Config.MemoryOverhead on top (room for the
// Sentry, the gofer and the agent), and
// pids.max is the requested limit times (host CPUs + 3) plus
// Config.PidsOverhead: every guest address space is a host stub process
// with up to GOMAXPROCS+1 threads, and a guest task blocked in a host
// system call holds a Sentry thread. The CPU quota is the requested one,
// set once the agent has connected and before Create returns: booting
// gVisor takes more CPU time than wall time, on several cores, and a
// quota of a core or less would throttle it for whole CFS periods. So
// gVisor starts without a quota to size itself by, and, as under runc, a
// sandbox sees the host's CPUs; its quota shows in its own cgroup inside.
// A restored sandbox runs unthrottled until its agent has reconnected.
//
// The requested limits are also set inside gVisor, in the sandbox's own
// cgroup of gVisor's cgroupfs, through the agent: pids.max, which gVisor
// enforces itself (a fork past it fails with EAGAIN, as on Linux, where a
// full host pids limit would crash the Sentry), and memory.limit_in_bytes
// and cpu.cfs_quota_us, which programs read to size themselves. Two gVisor behaviours bound
// what that buys: clones racing each other
// get past pids.max for a moment, and systrap pools the stub process of
// every address space it ever ran at once and never frees it, so a fork
// bomb grows the host's task count (whatever the limit inside) until the host backstop stops it, which
// kills the Sentry: the bomb ends its own sandbox. gVisor has no
// out-of-memory killer of its own either: going past the host memory
// limit kills the whole sandbox (the host kernel's OOM killer picks the
// Sentry). Both show as a stopped sandbox, with Stats.OOMKills above zero
// for memory. /proc/meminfo inside shows the host limit, the request plus
// the overhead.
//
// gVisor mounts a tmpfs on /tmp when the root's /tmp is empty, as the
// templates' is: files there live in the sandbox's memory and count
// against its memory limit, and they are part of a checkpoint, not of
// the root file system.
//
// # Confinement
//
// The spec is the runc driver's (capabilities, no_new_privs, rlimits, ID
// mapping of templates with shifted owners), applied by gVisor inside its
// kernel. With Config.IDSlots each sandbox's mapping is a host ID range
// of its own from the runc driver's slot table (ReserveIDs, idrange.go);
// a restore may then run under another range than its checkpoint, which
// runsc's spec validation would refuse, so it only warns (create.go).
// The seccomp profile is compiled once, as for runc, and the agent
// installs it inside gVisor, which runs seccomp filters for its processes
// as Linux does; on the one thread it starts processes from
// (--spawn-thread), as gVisor's cost of a filter grows with the threads
// that carry it. A checkpoint records the agent's argv in the image (argsFile), as
// runsc restores only with the same one. Where Corral cannot compile it,
// runsc applies the spec's (--oci-seccomp), answering every SCMP_ACT_ERRNO
// rule with EPERM, so the one rule that asks for another errno (clone3,
// ENOSYS) is left out there (spec.go). The agent also writes the sandbox's
// pids and memory limits inside gVisor before it serves (limits.go).
//
// # Processes
//
// `runsc run --detach` leaves two host processes, the sandbox (Sentry)
// and the gofer, which reparent to the daemon, a child subreaper; the
// driver hands both to the Reaper so that they never stay zombies (the
// stub processes are the Sentry's children and die with it). Delete kills
// everything in the sandbox's cgroup (a paused sandbox too), waits for the
// two to be reaped, and then has runsc forget the sandbox.
//
// # Cost
//
// Create is one `runsc run --detach`, almost all of it gVisor booting,
// plus the agent's connection; Delete one `runsc delete`; Status, Pause
// and Resume one runsc call each; Stats reads cgroup files and asks the
// agent for the task count. An exec costs nearly all its time in gVisor
// creating the process; a request that starts no process is a round trip
// to the agent. docs/BENCHMARKS.md has the figures.
package gvisor
