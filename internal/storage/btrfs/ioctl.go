package btrfs

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs ioctl ABI, from the kernel's include/uapi/linux/btrfs.h.
//
// Request numbers follow the generic _IOC encoding of
// include/uapi/asm-generic/ioctl.h: dir<<30 | size<<16 | type<<8 | nr,
// with _IOW = 1 and _IOR = 2 as dir, and type BTRFS_IOCTL_MAGIC (0x94).
// The sizes come from the Go mirrors of the structs below, which have the
// same layout as the C structs on every 64-bit Linux; ioctl_test.go pins
// the resulting numbers.
const (
	btrfsIoctlMagic = 0x94

	iocNone  = 0
	iocWrite = 1
	iocRead  = 2
)

// Request numbers, each under the header's definition.
const (
	// #define BTRFS_IOC_SYNC _IO(BTRFS_IOCTL_MAGIC, 8)
	iocSync = iocNone<<30 | btrfsIoctlMagic<<8 | 8
	// #define BTRFS_IOC_INO_LOOKUP _IOWR(BTRFS_IOCTL_MAGIC, 18, struct btrfs_ioctl_ino_lookup_args)
	iocInoLookup = (iocRead|iocWrite)<<30 | unsafe.Sizeof(inoLookupArgs{})<<16 | btrfsIoctlMagic<<8 | 18
	// #define BTRFS_IOC_SNAP_CREATE_V2 _IOW(BTRFS_IOCTL_MAGIC, 23, struct btrfs_ioctl_vol_args_v2)
	iocSnapCreateV2 = iocWrite<<30 | unsafe.Sizeof(volArgsV2{})<<16 | btrfsIoctlMagic<<8 | 23
	// #define BTRFS_IOC_SUBVOL_CREATE_V2 _IOW(BTRFS_IOCTL_MAGIC, 24, struct btrfs_ioctl_vol_args_v2)
	iocSubvolCreateV2 = iocWrite<<30 | unsafe.Sizeof(volArgsV2{})<<16 | btrfsIoctlMagic<<8 | 24
	// #define BTRFS_IOC_SUBVOL_GETFLAGS _IOR(BTRFS_IOCTL_MAGIC, 25, __u64)
	iocSubvolGetFlags = iocRead<<30 | 8<<16 | btrfsIoctlMagic<<8 | 25
	// #define BTRFS_IOC_SUBVOL_SETFLAGS _IOW(BTRFS_IOCTL_MAGIC, 26, __u64)
	iocSubvolSetFlags = iocWrite<<30 | 8<<16 | btrfsIoctlMagic<<8 | 26
	// #define BTRFS_IOC_FS_INFO _IOR(BTRFS_IOCTL_MAGIC, 31, struct btrfs_ioctl_fs_info_args)
	iocFSInfo = iocRead<<30 | unsafe.Sizeof(fsInfoArgs{})<<16 | btrfsIoctlMagic<<8 | 31
	// #define BTRFS_IOC_QUOTA_CTL _IOWR(BTRFS_IOCTL_MAGIC, 40, struct btrfs_ioctl_quota_ctl_args)
	iocQuotaCtl = (iocRead|iocWrite)<<30 | unsafe.Sizeof(quotaCtlArgs{})<<16 | btrfsIoctlMagic<<8 | 40
	// #define BTRFS_IOC_QGROUP_CREATE _IOW(BTRFS_IOCTL_MAGIC, 42, struct btrfs_ioctl_qgroup_create_args)
	iocQgroupCreate = iocWrite<<30 | unsafe.Sizeof(qgroupCreateArgs{})<<16 | btrfsIoctlMagic<<8 | 42
	// #define BTRFS_IOC_QGROUP_LIMIT _IOR(BTRFS_IOCTL_MAGIC, 43, struct btrfs_ioctl_qgroup_limit_args)
	// (_IOR although userspace passes the limit in: the kernel has always
	// defined it so, and only the number matters.)
	iocQgroupLimit = iocRead<<30 | unsafe.Sizeof(qgroupLimitArgs{})<<16 | btrfsIoctlMagic<<8 | 43
	// #define BTRFS_IOC_QUOTA_RESCAN _IOW(BTRFS_IOCTL_MAGIC, 44, struct btrfs_ioctl_quota_rescan_args)
	iocQuotaRescan = iocWrite<<30 | unsafe.Sizeof(quotaRescanArgs{})<<16 | btrfsIoctlMagic<<8 | 44
	// #define BTRFS_IOC_QUOTA_RESCAN_STATUS _IOR(BTRFS_IOCTL_MAGIC, 45, struct btrfs_ioctl_quota_rescan_args)
	iocQuotaRescanStatus = iocRead<<30 | unsafe.Sizeof(quotaRescanArgs{})<<16 | btrfsIoctlMagic<<8 | 45
	// #define BTRFS_IOC_QUOTA_RESCAN_WAIT _IO(BTRFS_IOCTL_MAGIC, 46)
	iocQuotaRescanWait = iocNone<<30 | btrfsIoctlMagic<<8 | 46
	// #define BTRFS_IOC_SNAP_DESTROY_V2 _IOW(BTRFS_IOCTL_MAGIC, 63, struct btrfs_ioctl_vol_args_v2)
	iocSnapDestroyV2 = iocWrite<<30 | unsafe.Sizeof(volArgsV2{})<<16 | btrfsIoctlMagic<<8 | 63
)

// Requests that create subvolumes, which SubvolumeIoctls lists. The v1
// requests take struct btrfs_ioctl_vol_args { __s64 fd; char
// name[BTRFS_PATH_NAME_MAX + 1]; }, 4096 bytes with BTRFS_PATH_NAME_MAX 4087.
const (
	// #define BTRFS_IOC_SNAP_CREATE _IOW(BTRFS_IOCTL_MAGIC, 1, struct btrfs_ioctl_vol_args)
	iocSnapCreate = iocWrite<<30 | 4096<<16 | btrfsIoctlMagic<<8 | 1
	// #define BTRFS_IOC_SUBVOL_CREATE _IOW(BTRFS_IOCTL_MAGIC, 14, struct btrfs_ioctl_vol_args)
	iocSubvolCreate = iocWrite<<30 | 4096<<16 | btrfsIoctlMagic<<8 | 14
)

// SubvolumeIoctls returns the ioctl request numbers that create btrfs
// subvolumes and snapshots (BTRFS_IOC_SNAP_CREATE, _SUBVOL_CREATE and their
// _V2 forms). btrfs lets any user who can write a directory create a
// subvolume there, and a subvolume has a qgroup of its own, outside the
// disk limit of the subvolume it sits in, so writes into a nested subvolume
// would escape a root's limit. Roots of this backend are overlayfs mounts,
// which answer these requests with ENOTTY, so a sandbox on them cannot do
// that (TestSubvolumeIoctlsRejected). A driver that gives a sandbox a btrfs
// directory directly (a volume, say) should deny these requests inside the
// sandbox, e.g. with a seccomp rule on ioctl's second argument.
func SubvolumeIoctls() []uint64 {
	return []uint64{iocSnapCreate, iocSubvolCreate, uint64(iocSnapCreateV2), uint64(iocSubvolCreateV2)}
}

const (
	// #define BTRFS_SUBVOL_RDONLY (1ULL << 1)
	subvolRdonly = 1 << 1
	// #define BTRFS_FIRST_FREE_OBJECTID 256ULL: the inode number of every
	// subvolume's root directory, and the objectid INO_LOOKUP resolves
	// to the subvolume itself.
	firstFreeObjectID = 256
	// #define BTRFS_QUOTA_CTL_ENABLE 1
	// #define BTRFS_QUOTA_CTL_DISABLE 2
	// #define BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA 4
	quotaCtlEnable       = 1
	quotaCtlDisable      = 2
	quotaCtlEnableSimple = 4
	// #define BTRFS_QGROUP_LIMIT_MAX_EXCL (1ULL << 1)
	qgroupLimitMaxExcl = 1 << 1
)

// volArgsV2 mirrors
//
//	#define BTRFS_SUBVOL_NAME_MAX 4039
//	struct btrfs_ioctl_vol_args_v2 {
//		__s64 fd;
//		__u64 transid;
//		__u64 flags;
//		union {
//			struct {
//				__u64 size;
//				struct btrfs_qgroup_inherit __user *qgroup_inherit;
//			};
//			__u64 unused[4];
//		};
//		union {
//			char name[BTRFS_SUBVOL_NAME_MAX + 1];
//			__u64 devid;
//			__u64 subvolid;
//		};
//	};
//
// 4096 bytes. We only ever pass names, never qgroup_inherit.
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// inoLookupArgs mirrors
//
//	#define BTRFS_INO_LOOKUP_PATH_MAX 4080
//	struct btrfs_ioctl_ino_lookup_args {
//		__u64 treeid;
//		__u64 objectid;
//		char name[BTRFS_INO_LOOKUP_PATH_MAX];
//	};
type inoLookupArgs struct {
	treeid   uint64
	objectid uint64
	name     [4080]byte
}

// fsInfoArgs mirrors struct btrfs_ioctl_fs_info_args, which begins
//
//	__u64 max_id; __u64 num_devices; __u8 fsid[BTRFS_FSID_SIZE]; ...
//
// and is padded to 1 KiB ("pad to 1k"); we only read fsid.
type fsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	_          [1024 - 32]byte
}

// quotaCtlArgs mirrors struct btrfs_ioctl_quota_ctl_args { __u64 cmd; __u64 status; }.
type quotaCtlArgs struct {
	cmd    uint64
	status uint64
}

// quotaRescanArgs mirrors struct btrfs_ioctl_quota_rescan_args
// { __u64 flags; __u64 progress; __u64 reserved[6]; }. RESCAN_STATUS sets
// flags to 1 while a rescan runs.
type quotaRescanArgs struct {
	flags    uint64
	progress uint64
	reserved [6]uint64
}

// qgroupCreateArgs mirrors struct btrfs_ioctl_qgroup_create_args
// { __u64 create; __u64 qgroupid; }; create = 0 removes the qgroup.
type qgroupCreateArgs struct {
	create   uint64
	qgroupid uint64
}

// qgroupLimitArgs mirrors
//
//	struct btrfs_qgroup_limit {
//		__u64 flags; __u64 max_rfer; __u64 max_excl; __u64 rsv_rfer; __u64 rsv_excl;
//	};
//	struct btrfs_ioctl_qgroup_limit_args {
//		__u64 qgroupid;
//		struct btrfs_qgroup_limit lim;
//	};
type qgroupLimitArgs struct {
	qgroupid uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
}

func nameArgs(name string) (*volArgsV2, error) {
	var a volArgsV2
	if len(name) >= len(a.name) {
		return nil, unix.ENAMETOOLONG
	}
	copy(a.name[:], name)
	return &a, nil
}

// subvolCreate creates an empty subvolume called name in directory dirFd.
func subvolCreate(dirFd int, name string) error {
	a, err := nameArgs(name)
	if err != nil {
		return err
	}
	return ioctl(dirFd, iocSubvolCreateV2, unsafe.Pointer(a))
}

// snapshot creates name in directory dirFd as a snapshot of the subvolume
// that srcFd is open on; flags may hold subvolRdonly.
func snapshot(srcFd, dirFd int, name string, flags uint64) error {
	a, err := nameArgs(name)
	if err != nil {
		return err
	}
	a.fd = int64(srcFd)
	a.flags = flags
	return ioctl(dirFd, iocSnapCreateV2, unsafe.Pointer(a))
}

// snapDestroy deletes the subvolume called name in directory dirFd. The
// kernel unlinks it at once and frees its extents later, in the cleaner
// thread. A subvolume that contains other subvolumes fails with ENOTEMPTY.
func snapDestroy(dirFd int, name string) error {
	a, err := nameArgs(name)
	if err != nil {
		return err
	}
	return ioctl(dirFd, iocSnapDestroyV2, unsafe.Pointer(a))
}

// subvolFlags returns the flags (0 or subvolRdonly) of the subvolume fd is open on.
func subvolFlags(fd int) (uint64, error) {
	var flags uint64
	err := ioctl(fd, iocSubvolGetFlags, unsafe.Pointer(&flags))
	return flags, err
}

// setSubvolFlags sets the flags of the subvolume fd is open on.
func setSubvolFlags(fd int, flags uint64) error {
	return ioctl(fd, iocSubvolSetFlags, unsafe.Pointer(&flags))
}

// subvolID returns the ID (tree objectid) of the subvolume fd is in:
// INO_LOOKUP with treeid 0 fills in the tree of fd, and objectid
// BTRFS_FIRST_FREE_OBJECTID asks for no path.
func subvolID(fd int) (uint64, error) {
	a := inoLookupArgs{objectid: firstFreeObjectID}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&a)); err != nil {
		return 0, err
	}
	return a.treeid, nil
}

// fsid returns the UUID of the filesystem fd is on, as sysfs names it
// under /sys/fs/btrfs.
func fsid(fd int) (string, error) {
	var a fsInfoArgs
	if err := ioctl(fd, iocFSInfo, unsafe.Pointer(&a)); err != nil {
		return "", err
	}
	return fmtUUID(a.fsid), nil
}

func fmtUUID(u [16]byte) string {
	const hexdigits = "0123456789abcdef"
	var out []byte
	for i, b := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hexdigits[b>>4], hexdigits[b&0xf])
	}
	return string(out)
}

// enableQuota turns qgroup accounting on for the filesystem. Full
// accounting starts with a rescan of every extent, which it waits for;
// simple quotas (Linux 6.7 and later; EINVAL before) count only extents
// written from now on and need no rescan. Enabling quotas that are
// already on is a no-op in the kernel.
func enableQuota(fd int, simple bool) error {
	a := quotaCtlArgs{cmd: quotaCtlEnable}
	if simple {
		a.cmd = quotaCtlEnableSimple
	}
	if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)); err != nil {
		return err
	}
	if simple {
		return nil
	}
	return ioctl(fd, iocQuotaRescanWait, nil)
}

// disableQuota turns qgroup accounting off and drops every qgroup, their
// limits included.
func disableQuota(fd int) error {
	a := quotaCtlArgs{cmd: quotaCtlDisable}
	return ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a))
}

// startRescan starts a rescan of full qgroup accounting in the
// background; the kernel clears the filesystem's inconsistent flag when
// it completes. It fails with EINPROGRESS while one runs, and with EINVAL
// under simple quotas, which cannot be rescanned.
func startRescan(fd int) error {
	var a quotaRescanArgs
	return ioctl(fd, iocQuotaRescan, unsafe.Pointer(&a))
}

// rescanRunning reports whether a qgroup rescan is under way.
func rescanRunning(fd int) (bool, error) {
	var a quotaRescanArgs
	if err := ioctl(fd, iocQuotaRescanStatus, unsafe.Pointer(&a)); err != nil {
		return false, err
	}
	return a.flags != 0, nil
}

// limitExclusive caps the exclusive bytes of level-0 qgroup 0/subvolid,
// i.e. the bytes that only this subvolume references.
func limitExclusive(fd int, subvolid, bytes uint64) error {
	a := qgroupLimitArgs{qgroupid: subvolid, flags: qgroupLimitMaxExcl, maxExcl: bytes}
	return ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a))
}

// destroyQgroup removes qgroup 0/subvolid. The kernel refuses (EBUSY)
// while the subvolume has not been dropped yet and returns ENOENT when the
// qgroup is already gone.
func destroyQgroup(fd int, subvolid uint64) error {
	a := qgroupCreateArgs{create: 0, qgroupid: subvolid}
	return ioctl(fd, iocQgroupCreate, unsafe.Pointer(&a))
}

// syncFS commits the current transaction and wakes the cleaner thread,
// which drops deleted subvolumes.
func syncFS(fd int) error {
	return ioctl(fd, iocSync, nil)
}
