#!/usr/bin/env bash
# Sets everything up (first run only) and runs the whole test suite.
# Quick run without the slow multi-process TP suite: bash scripts/test.sh -m "not slow"
# One file: bash scripts/test.sh tests/integration/test_generate.py
set -euo pipefail
# System packages some tests need, installed where we may (root), beside the Python installs:
# chromium and chromium-driver for the page tests (the monitor's, the chat page's), iptables for
# the NAT tests' MASQUERADE routers (iproute2's ip and tc are on every machine here).
wanted=()
command -v chromium >/dev/null && command -v chromedriver >/dev/null || wanted+=(chromium chromium-driver)
command -v iptables >/dev/null || wanted+=(iptables)
APT_INSTALL=""
if (( ${#wanted[@]} )); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "[test] installing ${wanted[*]} (beside the Python environments)"
        apt_log=$(mktemp)
        ( export DEBIAN_FRONTEND=noninteractive
          apt-get update -qq && apt-get install -y -qq "${wanted[@]}" ) >"$apt_log" 2>&1 &
        APT_INSTALL=$!
    else
        echo "[test] cannot install ${wanted[*]}: the browser and NAT tests that need them will be skipped"
    fi
fi
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
if [[ -n "$APT_INSTALL" ]] && ! wait "$APT_INSTALL"; then
    echo "[test] installing ${wanted[*]} failed; the tests that need them will be skipped:" >&2
    tail -5 "$apt_log" >&2
fi
# The integration tests start hundreds of real processes (peers, bootstraps, commands), each importing
# many of our modules: compile them once here, since an environment with PYTHONDONTWRITEBYTECODE set
# would otherwise compile them from source in every process.
python -m compileall -q swarm peer client routing hexswarm tests >/dev/null
# Lint and formatting are part of the suite: CI runs this script.
ruff check .
ruff format --check .
# Two test files at a time (pytest-xdist; a file's tests stay on one worker and share its swarm):
# a swarm test mostly waits on real processes (a peer takes ~8 s to come online on ~4 s of CPU),
# so two workers keep both cores busy. HEXSWARM_TEST_WORKERS=0 runs everything in one process.
# Files go to the workers in collection order, longest first (tests/conftest.py), not xdist's
# default of most tests first. The slowest 25 are listed at the end: where the minutes go.
exec python -m pytest -q -n "${HEXSWARM_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
    --durations=25 "$@"
