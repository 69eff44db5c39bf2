#!/usr/bin/env bash
# Sets everything up (first run only) and runs the demo: a private swarm on this machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec hexswarm demo "$@"
