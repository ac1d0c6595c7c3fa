package testutil

import "github.com/corralrun/corral/internal/rootfs"

func fillBusybox(dir string) error { return rootfs.FillBusybox(dir, "") }
