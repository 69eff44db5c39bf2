"""A chaos swarm: a bootstrap and five redundant peers that the tests hurt and heal (swarm.tools.chaos)."""

from __future__ import annotations

import pytest

from hexswarm.swarm.tools.chaos import LAYOUT, ChaosSwarm, child_processes
from hexswarm.swarm.tools.launcher import LocalSwarm

RUNS_PER_CLIENT = 5  # a fresh client now and then, so its bans of healed peers do not pile up


@pytest.fixture(scope="module")
def bystanders() -> frozenset[int]:
    """This process's children from before the chaos swarm (another file's shared swarm, when
    the test worker ran one first): not the chaos tests' to stop."""
    return frozenset(child_processes())


@pytest.fixture(scope="module")
def chaos(make_model, tmp_path_factory, bystanders):
    model_dir = make_model(arch="llama")
    with LocalSwarm(tmp_path_factory.mktemp("chaos")) as local:
        local.start_bootstrap()
        swarm = ChaosSwarm(local, model_dir, LAYOUT)
        swarm.start()
        yield swarm


class Clients:
    """Hands out a client per group of runs and shuts the previous one down."""

    def __init__(self, chaos: ChaosSwarm):
        self.chaos, self.model, self.group = chaos, None, None

    def for_run(self, run: int):
        from hexswarm.client import DistributedModelForCausalLM

        if self.group != run // RUNS_PER_CLIENT:
            self.close()
            self.group = run // RUNS_PER_CLIENT
            self.model = DistributedModelForCausalLM.from_pretrained(
                self.chaos.model_dir, initial_peers=self.chaos.local.initial_peers
            )
        self.model.push = run % 2 == 1  # every other run with peers pushing to each other (peer/push.py)
        return self.model

    def close(self) -> None:
        if self.model is not None:
            self.model.shutdown()
            self.model = None


@pytest.fixture(scope="module")
def clients(chaos):
    pool = Clients(chaos)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def local_model(chaos):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(chaos.model_dir)
