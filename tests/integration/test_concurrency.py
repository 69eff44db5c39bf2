"""Batched decode under real concurrency: 8 clients, different prompts, staggered starts, 2 peers.

Every client's greedy output must equal the local model's generate(), whatever the peers
batched together; the peers' logs must show that steps of several sessions did share a batch.
"""

import re
import threading
import time

import pytest
import torch

from hexswarm.swarm.tools.launcher import LocalSwarm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENTS = 8


@pytest.fixture(scope="module")
def pair(make_model, tmp_path_factory):
    """Two peers with half the blocks each; a wide batch window so batches surely form."""
    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch="llama")
    with LocalSwarm(tmp_path_factory.mktemp("pair")) as local:
        local.start_bootstrap()
        flags = ("--announce-period", "1", "--batch-window-ms", "50", "--prefill-chunk-tokens", "8")
        peers = [
            local.start_peer(model_dir, layers, name, *flags, wait=False)
            for name, layers in (("left", "0:3"), ("right", "3:6"))
        ]
        for proc in peers:
            local.wait_for_log(proc, "online:", timeout=180)
        model = DistributedModelForCausalLM.from_pretrained(
            model_dir, initial_peers=local.initial_peers, coverage_timeout=60
        )
        try:
            yield model, peers, model_dir
        finally:
            model.shutdown()


def test_eight_staggered_clients_equal_local(pair):
    from transformers import AutoModelForCausalLM

    model, peers, model_dir = pair
    local = AutoModelForCausalLM.from_pretrained(model_dir)
    prompts = [
        torch.randint(3, 400, (1 + i % 2, 3 + 3 * i), generator=torch.Generator().manual_seed(i))
        for i in range(CLIENTS)
    ]  # lengths 3..24 (the longest take several 8-token prefill chunks), batch sizes 1 and 2
    expected = [local.generate(p, max_new_tokens=16, do_sample=False) for p in prompts]
    got, errors = [None] * CLIENTS, []

    def client(i: int) -> None:
        try:
            time.sleep(0.2 * i)  # staggered: each joins while the others are mid-generation
            got[i] = model.generate(prompts[i], max_new_tokens=16, do_sample=False)
        except Exception as e:  # reported below, with the client's index
            errors.append((i, e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for i in range(CLIENTS):
        assert torch.equal(got[i], expected[i]), f"client {i} differs from the local model"

    def largest_batch() -> int:  # the peers log their batch sizes once per announce period
        rows = [
            int(n)
            for proc in peers
            for line in re.findall(r"decode batches \(rows: count\) \{([^}]*)\}", proc.log())
            for n in re.findall(r"(\d+):", line)
        ]
        return max(rows, default=0)

    deadline = time.monotonic() + 15
    while largest_batch() < 2 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert largest_batch() >= 2, "no decode batch ever held more than one sequence"
