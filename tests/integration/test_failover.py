"""A peer of the chain dies (SIGKILL) or stalls (SIGSTOP) mid-generation: the client fails over
and the output equals the local model's, token for token."""

import logging
import os
import signal
import threading
import time

import pytest
import torch
from transformers import StoppingCriteriaList

from hexswarm.client.worker import Cancelled
from hexswarm.swarm.trust.records import read_peer_records
from tests.integration.conftest import PEERS, SignalHopPeer, swarm_of

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_failover_mid_generation_is_exact(swarm, model, local_model, sig):
    input_ids = torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(5))
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
    expected = local_model.generate(input_ids, **kwargs)
    hurt = SignalHopPeer(model, swarm.peers, tokens=6, hop=-1, sig=sig)  # the last hop: p2 or p3
    try:
        got = model.generate(input_ids, stopping_criteria=StoppingCriteriaList([hurt]), **kwargs)
        assert hurt.victim in ("p2", "p3"), model.last_route
        assert torch.equal(got, expected), model.last_route
        (failover,) = model.last_failovers
        assert failover.peer == hurt.victim and hurt.victim not in model.last_route
        assert failover.recovered - failover.detected < 30  # generous: 2 shared cores
    finally:
        if hurt.victim is not None:  # bring it back for the other tests
            proc = swarm.peers[hurt.victim]
            swarm.local.stop(proc, timeout=1)
            layers, extra = PEERS[hurt.victim]
            swarm.peers[hurt.victim] = swarm.local.start_peer(
                swarm.model_dir, layers, hurt.victim, "--announce-period", "1", *extra
            )


def test_cancel_ends_a_generation_waiting_on_a_stalled_peer(make_model, tmp_path, caplog):
    """The only peer stalls mid-generation, so the step fails over and waits for a peer that
    does not come; `cancel` ends that wait at once, and the session is freed on the peer."""
    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch="llama", layers=2, seed=31)
    with swarm_of(model_dir, tmp_path, {"only": ("0:2", ())}) as (local, peers):
        model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers)
        stall = SignalHopPeer(model, peers, tokens=3, hop=0, sig=signal.SIGSTOP)
        cancel, raised = threading.Event(), []

        def generate() -> None:
            try:
                model.generate(
                    torch.tensor([[3, 14, 15]]), max_new_tokens=50, do_sample=False, cancel=cancel,
                    stopping_criteria=StoppingCriteriaList([stall]),
                )  # fmt: skip
            except Exception as e:
                raised.append(e)

        worker = threading.Thread(target=generate)
        caplog.set_level(logging.INFO, logger="hexswarm.client.peer_failures")
        try:
            worker.start()
            deadline = time.monotonic() + 60
            # past the step's deadline the client bans the stalled peer and waits for another
            while "failed on blocks" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "failed on blocks" in caplog.text, "the client never failed over from the stalled peer"
            cancel.set()
            cancelled_at = time.monotonic()
            worker.join(10)
            assert not worker.is_alive() and time.monotonic() - cancelled_at < 2
            assert len(raised) == 1 and isinstance(raised[0], Cancelled), raised
        finally:
            if stall.victim is not None:
                os.kill(peers["only"].popen.pid, signal.SIGCONT)
            worker.join(60)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                records = read_peer_records(model.swarm.dht, model.spec.model_id)
                if records and not any(r.open_sessions for r in records):
                    break
                time.sleep(0.25)
            assert records and not any(r.open_sessions for r in records), records
        finally:
            model.shutdown()
