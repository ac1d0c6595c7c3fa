package seccomp

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The native ABI of amd64, for Compile.
const (
	nativeArch = specs.ArchX86_64
	auditArch  = unix.AUDIT_ARCH_X86_64
	// x32Bit marks x32 calls, which share x86-64's architecture token.
	x32Bit = 0x40000000
)

// sysNums has the number of every call the profile names; -1 marks names
// of other architectures that amd64 does not have.
var sysNums = map[string]int{
	"acct": unix.SYS_ACCT, "add_key": unix.SYS_ADD_KEY, "adjtimex": unix.SYS_ADJTIMEX,
	"bpf": unix.SYS_BPF, "clock_adjtime": unix.SYS_CLOCK_ADJTIME, "clock_adjtime64": -1,
	"clock_settime": unix.SYS_CLOCK_SETTIME, "clock_settime64": -1, "clone": unix.SYS_CLONE,
	"clone3": unix.SYS_CLONE3, "create_module": unix.SYS_CREATE_MODULE, "delete_module": unix.SYS_DELETE_MODULE,
	"fanotify_init": unix.SYS_FANOTIFY_INIT, "finit_module": unix.SYS_FINIT_MODULE, "fsconfig": unix.SYS_FSCONFIG,
	"fsmount": unix.SYS_FSMOUNT, "fsopen": unix.SYS_FSOPEN, "fspick": unix.SYS_FSPICK,
	"get_kernel_syms": unix.SYS_GET_KERNEL_SYMS, "init_module": unix.SYS_INIT_MODULE, "io_uring_enter": unix.SYS_IO_URING_ENTER,
	"io_uring_register": unix.SYS_IO_URING_REGISTER, "io_uring_setup": unix.SYS_IO_URING_SETUP, "ioctl": unix.SYS_IOCTL,
	"ioperm": unix.SYS_IOPERM, "iopl": unix.SYS_IOPL, "kcmp": unix.SYS_KCMP,
	"kexec_file_load": unix.SYS_KEXEC_FILE_LOAD, "kexec_load": unix.SYS_KEXEC_LOAD, "keyctl": unix.SYS_KEYCTL,
	"lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE, "mount": unix.SYS_MOUNT, "mount_setattr": unix.SYS_MOUNT_SETATTR,
	"move_mount": unix.SYS_MOVE_MOUNT, "name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT, "nfsservctl": unix.SYS_NFSSERVCTL,
	"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "open_tree": unix.SYS_OPEN_TREE, "open_tree_attr": unix.SYS_OPEN_TREE_ATTR,
	"perf_event_open": unix.SYS_PERF_EVENT_OPEN, "personality": unix.SYS_PERSONALITY, "pidfd_getfd": unix.SYS_PIDFD_GETFD,
	"pivot_root": unix.SYS_PIVOT_ROOT, "process_madvise": unix.SYS_PROCESS_MADVISE, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
	"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV, "ptrace": unix.SYS_PTRACE, "query_module": unix.SYS_QUERY_MODULE,
	"quotactl": unix.SYS_QUOTACTL, "quotactl_fd": unix.SYS_QUOTACTL_FD, "reboot": unix.SYS_REBOOT,
	"request_key": unix.SYS_REQUEST_KEY, "setns": unix.SYS_SETNS, "settimeofday": unix.SYS_SETTIMEOFDAY,
	"stime": -1, "swapoff": unix.SYS_SWAPOFF, "swapon": unix.SYS_SWAPON,
	"syslog": unix.SYS_SYSLOG, "umount": -1, "umount2": unix.SYS_UMOUNT2,
	"unshare": unix.SYS_UNSHARE, "userfaultfd": unix.SYS_USERFAULTFD, "vm86": -1,
	"vm86old": -1,
}
