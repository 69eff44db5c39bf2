#!/usr/bin/env bash
# Sets everything up (first run only) and runs the whole test suite.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec python -m pytest -q "$@"
