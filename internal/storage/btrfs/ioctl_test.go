package btrfs

import (
	"testing"
	"unsafe"
)

// The expected numbers are what the C macros in include/uapi/linux/btrfs.h
// evaluate to on x86-64 and arm64.
func TestIoctlNumbers(t *testing.T) {
	tests := []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"BTRFS_IOC_SNAP_CREATE", iocSnapCreate, 0x50009401},
		{"BTRFS_IOC_SYNC", iocSync, 0x9408},
		{"BTRFS_IOC_SUBVOL_CREATE", iocSubvolCreate, 0x5000940e},
		{"BTRFS_IOC_INO_LOOKUP", iocInoLookup, 0xd0009412},
		{"BTRFS_IOC_SNAP_CREATE_V2", iocSnapCreateV2, 0x50009417},
		{"BTRFS_IOC_SUBVOL_CREATE_V2", iocSubvolCreateV2, 0x50009418},
		{"BTRFS_IOC_SUBVOL_GETFLAGS", iocSubvolGetFlags, 0x80089419},
		{"BTRFS_IOC_SUBVOL_SETFLAGS", iocSubvolSetFlags, 0x4008941a},
		{"BTRFS_IOC_FS_INFO", iocFSInfo, 0x8400941f},
		{"BTRFS_IOC_QUOTA_CTL", iocQuotaCtl, 0xc0109428},
		{"BTRFS_IOC_QGROUP_CREATE", iocQgroupCreate, 0x4010942a},
		{"BTRFS_IOC_QGROUP_LIMIT", iocQgroupLimit, 0x8030942b},
		{"BTRFS_IOC_QUOTA_RESCAN", iocQuotaRescan, 0x4040942c},
		{"BTRFS_IOC_QUOTA_RESCAN_STATUS", iocQuotaRescanStatus, 0x8040942d},
		{"BTRFS_IOC_QUOTA_RESCAN_WAIT", iocQuotaRescanWait, 0x942e},
		{"BTRFS_IOC_SNAP_DESTROY_V2", iocSnapDestroyV2, 0x5000943f},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %#x, want %#x", tt.name, tt.got, tt.want)
		}
	}
}

func TestStructSizes(t *testing.T) {
	tests := []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"btrfs_ioctl_vol_args_v2", unsafe.Sizeof(volArgsV2{}), 4096},
		{"btrfs_ioctl_ino_lookup_args", unsafe.Sizeof(inoLookupArgs{}), 4096},
		{"btrfs_ioctl_fs_info_args", unsafe.Sizeof(fsInfoArgs{}), 1024},
		{"btrfs_ioctl_quota_ctl_args", unsafe.Sizeof(quotaCtlArgs{}), 16},
		{"btrfs_ioctl_qgroup_create_args", unsafe.Sizeof(qgroupCreateArgs{}), 16},
		{"btrfs_ioctl_quota_rescan_args", unsafe.Sizeof(quotaRescanArgs{}), 64},
		{"btrfs_ioctl_qgroup_limit_args", unsafe.Sizeof(qgroupLimitArgs{}), 48},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("sizeof(%s) = %d, want %d", tt.name, tt.got, tt.want)
		}
	}
	if off := unsafe.Offsetof(volArgsV2{}.name); off != 56 {
		t.Errorf("offsetof(btrfs_ioctl_vol_args_v2, name) = %d, want 56", off)
	}
}

func TestFmtUUID(t *testing.T) {
	u := [16]byte{0x8a, 0x36, 0x7f, 0xc7, 0x68, 0x6f, 0x43, 0x57, 0xa3, 0x54, 0x6c, 0xa2, 0xaa, 0x04, 0xd4, 0x50}
	if got, want := fmtUUID(u), "8a367fc7-686f-4357-a354-6ca2aa04d450"; got != want {
		t.Errorf("fmtUUID = %s, want %s", got, want)
	}
}
