// Package driver defines the interface between the sandbox Manager and one
// isolation technology (runc, gVisor, QEMU).
//
// A driver creates, starts, deletes and reattaches to instances and dials the
// in-sandbox agent. It does not schedule, persist state or enforce quotas
// beyond applying the limits it is given; the Manager does those. Optional
// abilities (pause, checkpoint, live resize) are separate interfaces that a
// driver may also implement; callers discover them with a type assertion and
// a missing ability is reported with an error wrapping
// errdefs.ErrNotImplemented.
package driver

import (
	"context"
	"net"
	"os"
)

// Spec is everything a driver needs to create one instance.
type Spec struct {
	// ID names the instance; it is the sandbox ID, unique on this host,
	// and safe to use in file names and as a runtime container ID.
	ID string
	// RootFS is the host path of the sandbox's writable root tree,
	// prepared by storage. The driver must not delete it.
	RootFS string
	// Template, when set, is the host path of the sealed template tree
	// of which RootFS is still an unchanged copy (a new sandbox, nothing
	// restored into its root). A driver that needs a root as a whole,
	// such as a VM's disk image, may build it once from the template and
	// share it among sandboxes instead of reading RootFS. Read-only.
	Template string
	// Hostname inside the sandbox.
	Hostname string
	// Resources are hard limits; zero fields mean unlimited.
	Resources Resources
	// Network, when set, is a network namespace the daemon prepared for
	// the sandbox (veth, host-side rules; package network). Nil means a
	// new namespace with loopback only.
	Network *Network
	// Mounts are host directories the sandbox sees, in order.
	Mounts []Mount
	// Started, when set, is called at most once, before Create returns
	// and without blocking, once a connection made with DialAgent is
	// queued for the agent and nothing remains to be done to the instance
	// before the agent serves: a request sent from then on is served the
	// moment the agent is ready, while Create still waits for it. A driver
	// that cannot tell need not call it.
	Started func()
}

// Mount is a host directory the daemon prepared for a sandbox (package
// mounts): already resolved beneath an allowed root, with its read-only,
// ID-mapping or copy-on-write layering in place, so the driver only binds
// it, recursively, at Target.
type Mount struct {
	// Source is the host path to bind; Target the absolute path in the
	// sandbox.
	Source, Target string
	// ReadOnly asks the driver to bind it read-only too; the prepared
	// source already is, recursively, so this only keeps the runtime's
	// view consistent.
	ReadOnly bool
}

// HostIDs are the host user and group IDs of a sandbox's root user.
type HostIDs struct{ UID, GID uint32 }

// The stored ID range: on disk, templates, sandbox roots and volumes keep
// the files of sandbox user or group i as host ID StoredIDBase+i, for i
// below StoredIDSize. The range lies above the IDs distributions hand out
// to users and to /etc/subuid ranges, and no host process runs in it
// outside a sandbox. A sandbox that runs under other host IDs sees these
// files through ID-mapped mounts.
const (
	StoredIDBase = 1 << 31
	StoredIDSize = 1 << 16
)

// RootOwner is implemented by drivers whose sandboxes' root user is not
// host root (a user namespace maps it elsewhere): the daemon then maps
// the owner of a writable host directory it mounts to these IDs, so that
// the sandbox's root owns it inside and its files keep their owner on the
// host. A driver without it runs sandboxes' root as host root.
type RootOwner interface {
	// RootOwner returns the host IDs of the root user of a sandbox on the
	// root file system rootfs (prepared by storage, not yet started).
	RootOwner(rootfs string) (HostIDs, error)
}

// IDReserver is implemented by drivers that run each sandbox under host
// IDs of its own rather than in the stored range. The range has to be
// known before storage mounts the sandbox's root, whose layers show the
// stored range as the sandbox's, so the Manager reserves it first.
type IDReserver interface {
	// ReserveIDs reserves host IDs for sandbox id, whose root storage will
	// make from the template tree at template (a host path), and returns
	// the user namespace to make the root with (storage.RootOptions.IDMap;
	// the caller closes it once the root is made). It returns nil when
	// the sandbox runs in the stored range anyway (a template whose owners
	// were not shifted). Create then runs the sandbox under the reserved
	// IDs; Delete(id) releases them, also when Create was never called.
	ReserveIDs(ctx context.Context, id, template string) (*os.File, error)
}

// Network is a prepared network namespace and the files that go with it.
type Network struct {
	// NetNSPath is the bind-mounted namespace to join (OCI
	// linux.namespaces[type=network].path).
	NetNSPath string
	// ResolvConf and Hosts are host files bind-mounted read-only over
	// /etc/resolv.conf and /etc/hosts in the sandbox.
	ResolvConf string
	Hosts      string
	// CABundle and CACert, when set, are host files bind-mounted read-only
	// at CABundleDest and CACertDest: the trust store the sandbox's TLS
	// clients use, with the certificate of the egress proxy's CA that
	// signs the certificates of the connections it intercepts.
	CABundle string
	CACert   string
	// Env is added to the environment of the sandbox's processes (proxy
	// variables for tools that honour HTTP_PROXY).
	Env []string
}

// Where Network.CABundle and Network.CACert appear in the sandbox: the
// bundle over Debian's (and OpenSSL's, curl's and Python's usual) trust
// store file, the CA beside it for clients that take one extra file.
const (
	CABundleDest = "/etc/ssl/certs/ca-certificates.crt"
	CACertDest   = "/etc/ssl/certs/corral-egress-ca.pem"
)

// Resources are the hard limits of one instance.
type Resources struct {
	// MilliCPUs is the CPU quota in thousandths of a CPU (1000 = one core).
	MilliCPUs int64
	// MemoryBytes is the memory limit; swap is disabled.
	MemoryBytes int64
	// Pids is the maximum number of tasks (processes and threads), at
	// most MaxPids.
	Pids int64
}

// MaxPids is the largest pids limit a cgroup takes: Linux's PID_MAX_LIMIT
// on 64-bit hosts, 4194304 (pids.max refuses more with EINVAL).
const MaxPids = 4 << 20

// Status is what the driver knows of an instance's state on the host.
type Status string

// The statuses an instance can be in.
const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped" // exists, but its init has exited
	StatusUnknown Status = "unknown" // not known to the runtime
)

// Capabilities advertise what a driver can do beyond the basic lifecycle.
type Capabilities struct {
	// Pause means the driver implements Pauser.
	Pause bool `json:"pause"`
	// Checkpoint means the driver implements Checkpointer (memory state).
	Checkpoint bool `json:"checkpoint"`
	// Isolation names the boundary: "container", "gvisor" or "vm".
	Isolation string `json:"isolation"`
	// PrivateDisk means the instance writes to a disk of its own, not into
	// Spec.RootFS: storage never sees its changes, so a filesystem
	// snapshot, a fork from one or a stop and start would lose them.
	PrivateDisk bool `json:"private_disk,omitempty"`
	// Accel, for a VM runtime, is how its VMs run: "kvm" (hardware
	// virtualization) or "tcg" (QEMU's software emulation, many times
	// slower).
	Accel string `json:"accel,omitempty"`
}

// Stats are point-in-time resource readings of an instance.
type Stats struct {
	MemoryBytes   int64 `json:"memory_bytes"`
	CPUUsageNanos int64 `json:"cpu_usage_ns"`
	Pids          int64 `json:"pids"`
	OOMKills      int64 `json:"oom_kills"`
}

// Driver is one isolation technology. Implementations must be safe for
// concurrent use; calls for different IDs may run in parallel.
type Driver interface {
	// Name is the runtime name users select ("runc", "gvisor", "qemu").
	Name() string
	// Capabilities reports the optional abilities.
	Capabilities() Capabilities
	// Create creates and starts an instance and returns once its agent
	// accepts connections. A failed Create leaves nothing behind.
	Create(ctx context.Context, spec Spec) error
	// Delete stops the instance and releases everything the driver holds
	// for it. It is idempotent: deleting an unknown ID returns nil.
	Delete(ctx context.Context, id string) error
	// Status reports the instance's state; StatusUnknown with a nil error
	// when the runtime does not know the ID.
	Status(ctx context.Context, id string) (Status, error)
	// List returns the IDs of all instances this driver holds resources
	// for, including half-made ones, so that a restarted daemon can clean
	// up what its store does not know.
	List(ctx context.Context) ([]string, error)
	// DialAgent opens a new stream connection to the instance's agent.
	DialAgent(ctx context.Context, id string) (net.Conn, error)
	// Stats reads the instance's resource usage.
	Stats(ctx context.Context, id string) (Stats, error)
	// Close releases driver-wide resources; instances keep running.
	Close() error
}

// OOMCounter is implemented by drivers that read an instance's OOM-kill
// count (Stats.OOMKills) more cheaply than all of Stats. The Manager reads
// it around every exec to tell an OOM kill from another SIGKILL.
type OOMCounter interface {
	OOMKills(ctx context.Context, id string) (int64, error)
}

// Pauser freezes and thaws all processes of an instance.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Updater changes the limits of a running instance, all or nothing: when
// the host refuses one limit, those set before it get their old values
// back, and the error says so if they could not.
type Updater interface {
	Update(ctx context.Context, id string, r Resources) error
}

// TemplatePreparer adds to a new template tree what the driver needs in
// every sandbox root, such as empty mount points, so that starting a
// sandbox writes nothing into its copy-on-write root. It runs once per
// template, before the tree is sealed read-only, and must not follow
// symlinks out of dir.
type TemplatePreparer interface {
	PrepareTemplate(dir string) error
}

// Checkpointer saves the memory and kernel state of a running instance to
// a directory and starts new instances from such a directory. A fork is a
// Checkpoint with leaveRunning of one instance and a Restore of another.
// The file system is not part of the image: the caller gives the restored
// instance a root holding the files of the original at checkpoint time
// (a storage snapshot taken while the original is paused, or after a
// Checkpoint without leaveRunning).
type Checkpointer interface {
	// Checkpoint writes the state of instance id into dir, an empty
	// directory. With leaveRunning the instance continues afterwards;
	// without, it is stopped (StatusStopped) and must still be deleted.
	Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error
	// Restore creates a new instance id from the image in dir with the
	// given spec (its own root, limits and network; spec.ID must be id or
	// empty), as Create does: it returns once the restored agent accepts
	// connections, and a failed Restore leaves nothing behind. The
	// restored processes continue where the checkpoint left them.
	Restore(ctx context.Context, id string, spec Spec, dir string) error
}
