"""A real private swarm for the integration tests: bootstrap, peers and a client on 127.0.0.1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from swarm.launcher import LocalSwarm, Managed

# name -> (layers, extra run-peer flags). p2 and p3 overlap on 3:6 so a chain survives either
# leaving; "guard" has tight limits for the bad-input tests.
PEERS = {
    "p1": ("0:3", ()),
    "p2": ("2:6", ()),
    "p3": ("3:6", ()),
    "guard": ("0:3", ("--max-sessions", "2", "--max-length", "32", "--max-frame-mb", "1")),
}


@dataclass
class Swarm:
    local: LocalSwarm
    model_dir: Path
    peers: dict[str, Managed]

    @property
    def initial_peers(self) -> list[str]:
        return self.local.initial_peers


@pytest.fixture(scope="module")
def swarm(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama")
    with LocalSwarm(tmp_path_factory.mktemp("swarm")) as local:
        local.start_bootstrap()
        peers = {
            name: local.start_peer(model_dir, layers, name, "--announce-period", "1", *extra, wait=False)
            for name, (layers, extra) in PEERS.items()
        }
        for proc in peers.values():
            local.wait_for_log(proc, "online:", timeout=180)
        yield Swarm(local, Path(model_dir), peers)


@pytest.fixture(scope="module")
def model(swarm):
    from client import DistributedModelForCausalLM

    model = DistributedModelForCausalLM.from_pretrained(
        swarm.model_dir, initial_peers=swarm.initial_peers, coverage_timeout=60
    )
    yield model
    model.shutdown()


@pytest.fixture(scope="module")
def local_model(swarm):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(swarm.model_dir)
