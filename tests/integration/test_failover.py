"""A peer of the chain dies (SIGKILL) or stalls (SIGSTOP) mid-generation: the client fails over
and the output equals the local model's, token for token."""

import signal

import pytest
import torch
from transformers import StoppingCriteriaList

from tests.integration.conftest import PEERS, SignalHopPeer

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
