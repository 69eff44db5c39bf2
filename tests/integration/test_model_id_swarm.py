"""The model id is the model, with real `run-peer` processes on 127.0.0.1: two peers started from
two folders that hold the same checkpoint announce one model id and form one chain, which a
client started from a third folder uses; a peer of a fine-tune (one weight changed past the first
MiB) announces another id and is not part of that chain."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hexswarm.swarm.tools.launcher import LOOPBACK, LocalSwarm
from hexswarm.swarm.trust.records import read_models, read_peer_records
from tests.integration.test_coordinator import wait_until
from tests.unit.test_model_id import flip_bit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FAST = ("--announce-period", "1", "--throughput", "100", "--decode-ms", "1")


def test_one_checkpoint_in_two_folders_forms_one_swarm(make_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM
    from hexswarm.swarm.models.model_spec import model_identity
    from hexswarm.swarm.net.dht import start_dht

    original = Path(make_model(arch="llama", layers=4, seed=41))
    folders = [
        Path(shutil.copytree(original, tmp_path / name)) for name in ("alice-copy", "bob-copy", "carol-copy")
    ]
    tuned = Path(shutil.copytree(original, tmp_path / "tuned" / original.name))  # only content differs
    flip_bit(tuned / "model.safetensors", (tuned / "model.safetensors").stat().st_size - 3)
    cache = {
        "HEXSWARM_MODEL_CACHE": str(tmp_path / "model-cache")
    }  # both peers hash, and share the cache file
    with LocalSwarm(tmp_path / "swarm", env=cache) as local:
        local.start_bootstrap()
        peers = [
            local.start_peer(folders[0], "0:2", "alice", *FAST, wait=False),
            local.start_peer(folders[1], "2:4", "bob", *FAST, wait=False),
            local.start_peer(tuned, "2:4", "tuned", *FAST, wait=False),
        ]
        for proc in peers:
            local.wait_for_log(proc, "online:", timeout=180)
        model_id, tuned_id = model_identity(original)[0], model_identity(tuned)[0]
        assert model_id != tuned_id
        assert all(f"online: serving {model_id} blocks" in p.log() for p in peers[:2])
        dht = start_dht(local.initial_peers, None, host_maddrs=[LOOPBACK], client_mode=True)
        try:
            names = lambda: {r.name for r in read_peer_records(dht, model_id)}  # noqa: E731
            assert wait_until(lambda: names() == {"alice", "bob"}, 30, "both folders' peers in one swarm")
            assert read_models(dht) == {model_id: 4, tuned_id: 4}
            assert {r.name for r in read_peer_records(dht, tuned_id)} == {"tuned"}
        finally:
            dht.shutdown()
        client = DistributedModelForCausalLM.from_pretrained(
            folders[2], initial_peers=local.initial_peers, coverage_timeout=60
        )
        try:
            assert client.spec.model_id == model_id
            prompt = torch.tensor([[5, 6, 7, 8]])
            remote = client.generate(prompt, max_new_tokens=4, do_sample=False)
        finally:
            client.shutdown()
    local_model = AutoModelForCausalLM.from_pretrained(original)
    assert torch.equal(remote, local_model.generate(prompt, max_new_tokens=4, do_sample=False))
