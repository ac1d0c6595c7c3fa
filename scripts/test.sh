#!/bin/sh
# Runs every Corral test as root: unit, integration against real runc,
# btrfs, overlayfs, cgroups and SQLite, and end-to-end through the CLI.
# Installs missing dependencies first. CORRAL_TEST_REQUIRE=1 turns skipped
# requirements into failures (CI sets it).
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
go vet ./...
# The race detector over the packages whose tests are unit tests or short
# integration tests. Left out: test/e2e and test/hostile (root, through the
# CLI), internal/bench (it times real runs), and the packages that drive
# real runc, gVisor, btrfs or the daemon (driver/runc, driver/gvisor,
# driver/internal/ocirt, daemon, storage/btrfs, storage/overlay). The
# Manager's own tests (internal/sandbox) run on fakes and are in.
# -race needs cgo for this step only; the helpers that build corral and
# corral-agent for tests set CGO_ENABLED=0 themselves, so those binaries
# stay static.
CGO_ENABLED=1 go test -race -p 1 -count=1 -timeout 10m \
	./internal/admission ./internal/agentclient ./internal/agentdialout ./internal/agentserver ./internal/audit ./internal/cli \
	./internal/doctor ./internal/driver/fake ./internal/e2b ./internal/egress ./internal/interpreter ./internal/codeclient \
	./internal/errdefs ./internal/events ./internal/ociimage ./internal/templates \
	./internal/mcp ./internal/tenancy ./internal/metrics ./internal/mountinfo ./internal/network ./internal/network/fakenet ./internal/subreaper ./internal/refill \
	./internal/sandbox ./internal/seccomp ./internal/server ./internal/snapshotdir \
	./internal/storage/fake ./internal/storage/internal/fsutil ./internal/storage/internal/ovl \
	./internal/records ./internal/records/memstore ./internal/rootfs ./internal/secrets ./internal/undo ./internal/untar ./internal/webhook ./internal/wire \
	./sdk
# One package at a time (-p 1): several packages measure latency under
# attack (test/hostile) or time streams, and on a 2-core machine two such
# packages running at once would measure each other.
exec go test -p 1 -count=1 -timeout 25m ./... "$@"
