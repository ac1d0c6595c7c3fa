// Package vm is the VM driver (runtime "vm"): each sandbox is a QEMU
// microVM with its own guest kernel, so code in the sandbox makes its
// system calls to that kernel and reaches the host only through QEMU's
// emulated devices. QEMU uses KVM where /dev/kvm opens and TCG (software
// emulation, many times slower) elsewhere.
//
// The driver owns, for each sandbox, a directory <Root>/sandboxes/<id>:
// the root disk (disk.qcow2, a copy-on-write overlay that takes the
// guest's writes, on a read-only ext4 image made with mkfs.ext4 -d), the
// agent's socket, QEMU's QMP socket, pid file and console log; and the
// QEMU process's host cgroup. The image is the template's, built once per
// template tree and shared, in <Root>/cache, when the Manager says the
// root is still the template's unchanged copy (driver.Spec.Template), or
// else the sandbox's own, root.img, of its root tree. The cache also holds
// the initramfs, built once per guest kernel and agent binary. The driver
// never writes the sandbox's root tree, and the guest's writes stay on
// its disk: they are not seen in the tree on the host, so storage
// snapshots, forks and a stopped sandbox's restart do not carry them.
//
// # Boot
//
// The guest kernel is Debian's linux-image-cloud-amd64, unpacked (not
// installed) into Config.KernelDir; its virtio drivers are modules, so the
// initramfs holds the modules the guest needs (found with their
// dependencies from the modules' own .modinfo) and the agent binary,
// which the kernel runs as init (rdinit) with `agent --vm`: package
// vmguest loads the modules, mounts the disk, makes it the root, puts
// itself in a guest cgroup with the sandbox's limits and then serves as
// under any other runtime. QEMU starts paused (-S) so that it is in its
// host cgroup before the guest runs.
//
// # Agent transport
//
// The agent dials out, as under gVisor (package agentdialout): the VM has
// a virtio-serial port whose host end is a unix socket that QEMU connects
// to the driver's listener (reconnecting every second when the connection
// drops), and the agent runs a yamux session over the port. A request
// sent before the guest is up waits in the socket, so the first request
// is answered as soon as the agent serves.
//
// # Resources
//
// The VM's memory is the sandbox's memory limit plus GuestOverhead for
// the guest kernel, the initramfs and the agent; inside, the guest kernel
// enforces the limit itself on the cgroup that holds the agent and
// everything it starts, as it does pids, and its OOM killer ends the
// biggest process there, never the agent (PID 1). Stats reports the
// guest's task and OOM-kill counts, read through the agent, and the
// memory and CPU time of the QEMU process, whose host cgroup has the VM's
// size plus HostOverhead as its memory limit and the sandbox's CPU quota
// (set once the guest has booted). The VM has as many vCPUs as the CPU
// limit rounded up.
//
// # Network
//
// QEMU runs in the sandbox's network namespace, which the daemon
// prepared as for any runtime. With loopback only (mode none) the VM has
// no network device. With a link to the host (modes allowlist and open),
// the driver makes a tap device there and bridges it with the link, whose
// IPv4 address, default route and MTU the guest takes over (package
// vmguest configures them), so the host side (routes, nftables rules, the
// DNS filter and the proxy) applies to the VM unchanged. The sandbox's
// resolv.conf and hosts, which other runtimes bind-mount, are copied into
// the guest's /etc once the agent is up.
//
// # Not yet
//
// Host mounts fail with ErrNotImplemented; there are no memory snapshots;
// cached template images stay until removed by hand.
//
// # Cost
//
// Create is a qemu-img create and the boot, after an mkfs.ext4 of the
// root tree for a sandbox without a cached template image; Status, Pause and Resume are one QMP command each; Stats reads
// cgroup files and two guest files through the agent.
package vm
