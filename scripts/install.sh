#!/bin/sh
# Installs Corral on Debian 12 (as root): dependencies, the corral binary and
# the agent-only corral-agent next to it in /usr/local/bin, the daemon running in the background, and the default
# template (a Debian userland with python3, node, git; a few minutes the
# first time). Safe to run again.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
echo "corral: building" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/corralrun/corral/internal/cli.Version=$(git describe --always --dirty 2>/dev/null || echo dev)" -o /usr/local/bin/corral ./cmd/corral
CGO_ENABLED=0 go build -trimpath -o /usr/local/bin/corral-agent ./cmd/corral-agent

if ! corral ls >/dev/null 2>&1; then
	echo "corral: starting the daemon (log: /var/log/corral.log)" >&2
	mkdir -p /var/log
	nohup corral server >>/var/log/corral.log 2>&1 </dev/null &
	i=0
	until corral ls >/dev/null 2>&1; do
		i=$((i + 1))
		if [ "$i" -gt 150 ]; then
			echo "corral: the daemon did not start; see /var/log/corral.log" >&2
			tail -n 20 /var/log/corral.log >&2
			exit 1
		fi
		sleep 0.2
	done
fi
if ! corral template ls | grep -q '^default '; then
	echo "corral: building the default template" >&2
	corral template build default --recipe debian
fi
echo "corral: ready" >&2
