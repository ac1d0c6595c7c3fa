#!/bin/sh
# Runs every Corral test as root: unit, integration against real runc,
# btrfs, overlayfs, cgroups and SQLite, and end-to-end through the CLI.
# Installs missing dependencies first. CORRAL_TEST_REQUIRE=1 turns skipped
# requirements into failures (CI sets it).
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
go vet ./...
# One package at a time (-p 1): several packages measure latency under
# attack (test/hostile) or time streams, and on a 2-core machine two such
# packages running at once would measure each other.
exec go test -p 1 -count=1 -timeout 25m ./... "$@"
