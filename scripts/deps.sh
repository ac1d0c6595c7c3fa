#!/bin/sh
# Installs what Corral needs on Debian 12 (as root): Debian packages, and a
# Go toolchain from the Go module proxy when the installed one is missing
# or older than go.mod asks for. Safe to run again.
set -eu
cd "$(dirname "$0")/.."

# Every program the daemon or a test runs comes from one of these (or from
# Debian's essential set): runc, mkfs.btrfs, debootstrap, busybox, unshare,
# nft (the network tests read the kernel's rules back), curl, tmux. The
# code interpreter's own tests run its Python kernel (ipykernel, with
# pandas and matplotlib for rich results) on the host, outside a sandbox.
PKGS="runc btrfs-progs debootstrap busybox-static util-linux iproute2 nftables ca-certificates curl unzip tmux"
PKGS="$PKGS python3-ipykernel python3-pandas python3-matplotlib"
# The Python SDK (sdk/python) and its tests, run by Debian's python3:
# httpx and websockets are its dependencies, pytest runs its tests and
# mypy checks its type hints; venv lets a test install it with pip.
PKGS="$PKGS python3-httpx python3-websockets python3-pytest python3-pytest-asyncio python3-mypy python3-venv"
# The cluster tests run a real etcd server, their own on free loopback
# ports (the package's own service, where systemd starts it, is not used).
PKGS="$PKGS etcd-server"
# The vm runtime: QEMU (with its firmware) and qemu-img for the disk
# overlays; mkfs.ext4 (e2fsprogs, essential) makes the root images.
PKGS="$PKGS qemu-system-x86 qemu-utils"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# The E2B compatibility tests run node and npm. A Node.js installed from
# elsewhere may bring its own npm (and conflict with Debian's), so Debian's
# are installed only when there is no npm at all.
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
	echo "corral: installing Debian packages:$missing" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)
have=$(go env GOVERSION 2>/dev/null | sed 's/^go//' || true)
newer() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n1)" = "$1" ]; }
if [ -z "$have" ] || ! newer "$have" "$want"; then
	# The Go module proxy serves toolchains as the module golang.org/toolchain.
	dir=/usr/local/lib/corral-go
	if [ ! -x "$dir/bin/go" ] || ! newer "$("$dir/bin/go" env GOVERSION | sed 's/^go//')" "$want"; then
		echo "corral: installing Go $want from the Go module proxy" >&2
		proxy=$(go env GOPROXY 2>/dev/null | cut -d, -f1 || true)
		[ -n "$proxy" ] && [ "$proxy" != off ] && [ "$proxy" != direct ] || proxy=https://proxy.golang.org
		tmp=$(mktemp -d)
		curl -fsSL -o "$tmp/go.zip" "$proxy/golang.org/toolchain/@v/v0.0.1-go$want.linux-amd64.zip"
		unzip -q "$tmp/go.zip" -d "$tmp"
		rm -rf "$dir"
		mv "$tmp/golang.org/toolchain@v0.0.1-go$want.linux-amd64" "$dir"
		chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/* 2>/dev/null || true
		rm -rf "$tmp"
	fi
	ln -sf "$dir/bin/go" /usr/local/bin/go
fi

# gVisor: Debian's 2022 runsc lacks systrap and netstack here, so build the
# pinned current release from the Go module proxy. CGO_ENABLED=0 is
# required (with cgo every sandbox start fails); the version string is set
# with -ldflags because `go install` does not stamp it.
RUNSC_MODULE=gvisor.dev/gvisor/runsc@v0.0.0-20260527191743-a81fd9dd382e
RUNSC_VERSION=release-20260527.0
if ! runsc --version 2>/dev/null | grep -q "version $RUNSC_VERSION\$"; then
	echo "corral: building runsc $RUNSC_VERSION from the Go module proxy (about two minutes)" >&2
	CGO_ENABLED=0 GOBIN=/usr/local/bin go install \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION" "$RUNSC_MODULE"
fi

# The vm runtime's guest kernel: Debian's cloud kernel, unpacked (never
# installed, so the host's /boot is left alone) where the driver looks for
# it by default. Its virtio drivers are modules, which the driver puts in
# the guest's initramfs.
VM_KERNEL_DIR=/usr/local/lib/corral/vm-kernel
if ! ls "$VM_KERNEL_DIR"/boot/vmlinuz-* >/dev/null 2>&1; then
	echo "corral: unpacking Debian's linux-image-cloud-amd64 into $VM_KERNEL_DIR" >&2
	pkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1)
	[ -n "$pkg" ] || { echo "corral: linux-image-cloud-amd64 names no kernel package" >&2; exit 1; }
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt-get download runs as _apt where it can
	(cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1)
	rm -rf "$VM_KERNEL_DIR.new"
	mkdir -p "$VM_KERNEL_DIR.new"
	dpkg-deb -x "$tmp"/*.deb "$VM_KERNEL_DIR.new"
	rm -rf "$tmp" "$VM_KERNEL_DIR"
	mv "$VM_KERNEL_DIR.new" "$VM_KERNEL_DIR"
fi
