"""Shared fixtures: small random checkpoints made with save_pretrained (no model hub needed)."""

from __future__ import annotations

import os

import pytest

# Before torch loads: the test process shares 2 cores with the swarm's peers (see swarm.tools.launcher).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    # Peers cache throughput measurements; keep the tests' measurements out of ~/.cache.
    os.environ["HEXSWARM_CACHE_DIR"] = str(tmp_path_factory.mktemp("hexswarm-cache"))


@pytest.fixture(scope="session")
def make_model(tmp_path_factory):
    """make_model(arch=..., layers=..., ...) -> checkpoint dir, cached per argument set."""
    from hexswarm.swarm.commands.tiny_model import make_tiny_model

    made = {}

    def make(**kwargs):
        key = tuple(sorted(kwargs.items()))
        if key not in made:
            directory = tmp_path_factory.mktemp("model")
            kwargs.setdefault("hidden", 128)
            kwargs.setdefault("heads", 4)
            kwargs.setdefault("kv_heads", 2)
            kwargs.setdefault("layers", 6)
            made[key] = make_tiny_model(directory, **kwargs)
        return made[key]

    return make


# The files that take longest (seconds of a serial run, docs/testing.md), in that order. The
# two test workers take whole files in collection order (--dist loadfile), so these start first
# and the many short unit files fill the end, instead of one worker idling behind a long file.
LONGEST_FIRST = (
    "tests/integration/test_real_model.py",  # 261 s
    "tests/integration/test_coordinator.py",  # 145
    "tests/integration/test_public_swarm.py",  # 106
    "tests/integration/test_verify.py",  # 100
    "tests/integration/test_observed_speed.py",  # 95
    "tests/integration/test_quant.py",  # 93
    "tests/integration/test_cli.py",  # 91
    "tests/integration/test_disaggregation.py",  # 83
    "tests/integration/test_bootstrap_outage.py",  # 77
    "tests/integration/test_demo_signals.py",  # 74
    "tests/integration/test_shutdown.py",  # 71
    "tests/chaos/test_chaos.py",  # 68
    "tests/unit/test_gguf_checkpoint.py",  # 37 (the real model's GGUF: 70 s beside a second worker)
)


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files first, then the other swarm tests, then the unit tests; a file's tests
    keep their order and stay together (the sort is stable)."""

    def rank(item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        if path in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(path)
        return (2 if path.startswith("tests/unit/") else 1), 0

    items.sort(key=rank)
