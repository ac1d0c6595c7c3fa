#!/bin/sh
# Runs every Corral test as root: unit, integration against real runc,
# btrfs, overlayfs, cgroups and SQLite, and end-to-end through the CLI.
# Installs missing dependencies first. CORRAL_TEST_REQUIRE=1 turns skipped
# requirements into failures (CI sets it).
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
go vet ./...
exec go test -count=1 -timeout 25m ./... "$@"
