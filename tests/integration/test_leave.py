"""A peer told to stop refuses new sessions, lets open ones finish, then exits on its own."""

import signal
import time

import pytest
import torch

from hexswarm.swarm.trust.records import read_peer_records
from hexswarm.swarm.wire.protocol import Error, ErrorCode, Open
from tests.integration.conftest import peer_id_of
from tests.integration.test_bad_input import RawStream

pytestmark = pytest.mark.integration


def test_leaving_peer_drains_open_sessions(swarm, make_model):
    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch="llama", layers=2, seed=9)
    drainer = swarm.local.start_peer(
        model_dir, "0:2", "drainer", "--announce-period", "1", "--drain-timeout", "60"
    )
    client = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.initial_peers)
    try:
        with client.inference_session(max_length=8):
            client(torch.tensor([[5, 6, 7]]))  # a session is open on the drainer
            drainer_id = peer_id_of(client, "drainer")
            drainer.popen.send_signal(signal.SIGTERM)
            swarm.local.wait_for_log(drainer, "leaving:", timeout=30)

            newcomer = RawStream(client, drainer_id)
            try:
                reply = newcomer.ask(_open(client))
                assert isinstance(reply, Error) and reply.code == ErrorCode.LEAVING
            finally:
                newcomer.close()
            logits = client(torch.tensor([[8]])).logits  # the open session still works
            assert logits.shape[:2] == (1, 1)
            assert drainer.alive()
        began = time.monotonic()
        drainer.popen.wait(timeout=30)  # the session closed: the peer exits long before its drain timeout
        assert drainer.popen.returncode == 0 and time.monotonic() - began < 30
        # its last word marked it gone: no reader lists it as leaving until the record expires
        assert drainer_id not in {
            r.peer_id for r in read_peer_records(client.swarm.dht, client.spec.model_id)
        }
    finally:
        client.shutdown()
        swarm.local.stop(drainer)


def _open(client) -> Open:
    return Open("late", client.spec.model_id, 0, 2, 8, 1, "float32")


def test_no_chain_within_the_coverage_timeout_fails_then_not_after_the_retry_budget(swarm, make_model):
    """Every block has a peer, but its KV cache is taken: a new session fails after its coverage
    timeout with the router's reason (NoChainError), not after the 60 s retry budget."""
    from hexswarm.client import DistributedModelForCausalLM
    from hexswarm.client.failover import NoChainError

    model_dir = make_model(arch="llama", layers=2, seed=11)
    full = swarm.local.start_peer(model_dir, "0:2", "full", "--announce-period", "1", "--cache-tokens", "16")
    holder = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.initial_peers)
    late = DistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=swarm.initial_peers, coverage_timeout=3
    )
    try:
        with holder.inference_session(max_length=16):
            holder(torch.tensor([[5, 6, 7]]))  # takes all 16 cache tokens
            _wait_for_cache_left(holder, "full", 0)  # the peer announces what is left (each second)
            began = time.monotonic()
            with pytest.raises(NoChainError, match="without cache"):
                late.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
            assert time.monotonic() - began < 20
    finally:
        late.shutdown()
        holder.shutdown()
        swarm.local.stop(full)


def _wait_for_cache_left(model, name: str, tokens: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = {r.name: r for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
        if name in records and records[name].cache_tokens_left <= tokens:
            return
        time.sleep(0.25)
    raise AssertionError(f"{name} did not announce {tokens} cache tokens left within {timeout} s")
