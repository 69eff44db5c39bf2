"""Seeded chaos: peers of the chain in use are SIGKILLed, SIGSTOPped or made to answer errors/NaN
mid-generation; every output equals the no-failure output, and no process is left behind."""

import random
import time

import pytest
import torch

from hexswarm.swarm.tools.chaos import chaos_run, child_processes, group_members

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.chaos]

RUNS = 20


def test_no_failure_output_equals_local(clients, local_model):
    model = clients.for_run(0)
    prompt = torch.tensor([[5, 17, 42, 9]])
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(prompt, **kwargs), local_model.generate(prompt, **kwargs))
    assert model.last_failovers == []


@pytest.mark.parametrize("run", range(RUNS))
def test_chaos_run_is_exact(run, chaos, clients, local_model):
    faults = 1 + (run % 3 == 0)
    # The layout keeps every block served with any two peers down: a peer killed earlier may
    # still be loading only while this run hurts one (blocks 4:6 have three peers; a run that
    # hurt two of them beside a third still loading failed with no peer left for 4:6).
    chaos.settle(max_starting=2 - faults)
    model = clients.for_run(run)
    result = chaos_run(model, local_model, chaos, seed=run, new_tokens=12, faults=faults)
    summary = [(f.peer, f.action, f.after_token, f.recovery_s) for f in result.faults]
    assert result.faults, "no peer of the chain was hurt"
    assert result.exact, f"output differs after {summary}; chain now {result.route}"
    assert all(f.recovery_s is not None for f in result.faults), summary
    assert result.retries >= 1
    assert chaos.leftovers() == []  # killed peers' DHT child and p2p daemon are gone too


def test_spent_budget_raises_an_error_that_lists_what_was_tried(chaos, local_model):
    from transformers import StoppingCriteriaList

    from hexswarm.client import DistributedModelForCausalLM, FailoverError, RetryPolicy
    from hexswarm.swarm.tools.chaos import ChaosMonkey

    chaos.settle(max_starting=0)
    model = DistributedModelForCausalLM.from_pretrained(
        chaos.model_dir, initial_peers=chaos.local.initial_peers, retry=RetryPolicy(max_retries=0)
    )
    monkey = ChaosMonkey(chaos, lambda: model.session.peer_names(), random.Random(0), 4, actions=("error",))
    try:
        with pytest.raises(FailoverError) as info:
            model.generate(
                torch.tensor([[5, 6, 7]]),
                max_new_tokens=4,
                min_new_tokens=4,
                stopping_criteria=StoppingCriteriaList([monkey]),
            )
    finally:
        chaos.heal()
        model.shutdown()
    (fault,) = monkey.faults
    (attempt,) = info.value.attempts
    assert attempt.peer == fault.peer and "0 retries allowed" in str(info.value)
    assert f"{fault.peer}[" in str(info.value)


def test_no_process_left_behind(chaos, clients, bystanders):
    clients.close()
    groups = [p.popen.pid for p in chaos.local.processes]
    chaos.local.close()

    def left() -> list[int]:  # the clients' DHT processes and every peer must be gone
        return [pid for pid in child_processes() if pid not in bystanders]

    deadline = time.monotonic() + 10
    while (any(group_members(g) for g in groups) or left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [g for g in groups if group_members(g)] == []
    assert left() == []
