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
