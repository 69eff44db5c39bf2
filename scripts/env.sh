#!/usr/bin/env bash
# Creates .venv (if missing) and installs hexswarm into it. Sourced by demo.sh and test.sh.
# torch goes in first, pinned, so that pip takes the CPU build instead of pulling CUDA packages.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.hexswarm-installed"
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
if [[ ! -f "$STAMP" || "$ROOT/setup.cfg" -nt "$STAMP" ]]; then
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "torch==2.13.0"
    "$VENV/bin/pip" install --quiet -e "$ROOT[test]"
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
