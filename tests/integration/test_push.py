"""Push between peers on a real swarm: peers send their outputs straight to the next peer.

A swarm of its own (a bootstrap and seven peers of a 6-block model): a [0:2), b and b2
[2:4), c [4:6), and three that break pushes on purpose (peer/faults.py --debug-push): r [2:4)
refuses pushed steps, d [4:6) drops them, e [0:2) pushes the next peer an output other than
the one it returns to the client. A test picks its chain by leaving peers out of the client's routes
(`swarm.distrusted`, the client's own list of peers it avoids).
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import StoppingCriteriaList

from tests.integration.conftest import SignalHopPeer, swarm_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LAYOUT = {
    "a": ("0:2", ()),
    "b": ("2:4", ()),
    "c": ("4:6", ()),
    "r": ("2:4", ("--debug-push", "refuse")),
    "d": ("4:6", ("--debug-push", "drop")),
    "e": ("0:2", ("--debug-push", "equivocate")),
    "b2": ("2:4", ()),
}
NEW_TOKENS = 12
KWARGS = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


@pytest.fixture(scope="module")
def push_swarm(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama")
    with swarm_of(model_dir, tmp_path_factory.mktemp("push"), LAYOUT) as (local, peers):
        yield local, model_dir, peers


@pytest.fixture(scope="module")
def local_model(push_swarm):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(push_swarm[1])


@pytest.fixture
def client(push_swarm):
    """A fresh client per test, so one test's bans do not shape the next one's chains."""
    from hexswarm.client import DistributedModelForCausalLM

    local, model_dir, _ = push_swarm
    model = DistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=local.initial_peers, push=True
    )
    yield model
    model.shutdown()


def avoid(model, *names: str) -> None:
    """Leaves these peers out of the client's routes; one an earlier test killed (the middle
    peer of the failover test is b or r) has no record left and needs no leaving out."""
    from hexswarm.swarm.trust.records import read_peer_records

    ids = {r.name: r.peer_id for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
    model.swarm.distrusted.update(ids[name] for name in names if name in ids)


def _prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(seed))


def test_pushed_generation_equals_local_generate(client, local_model):
    avoid(client, "r", "d", "e", "b2")
    prompt = _prompt(1)
    got = client.generate(prompt, **KWARGS)
    assert client.last_route.startswith("a[0:2) -> b[2:4) -> c[4:6)"), client.last_route
    assert torch.equal(got, local_model.generate(prompt, **KWARGS))
    steps = client.last_hop_steps  # prefill + NEW_TOKENS - 1 decode steps, three hops each
    assert steps == {"sent": NEW_TOKENS, "pushed": 2 * NEW_TOKENS, "push_failed": 0}, steps

    client.push = False  # the relay baseline: the same tokens, every hop sent by the client
    assert torch.equal(client.generate(prompt, **KWARGS), got)
    assert client.last_hop_steps == {"sent": 3 * NEW_TOKENS, "pushed": 0, "push_failed": 0}


def test_refused_and_dropped_pushes_fall_back_to_relay(client, local_model):
    avoid(client, "b", "c", "e", "b2")  # the chain a -> r (refuses pushes) -> d (drops them)
    prompt = _prompt(2)
    got = client.generate(prompt, **KWARGS)
    assert client.last_route.startswith("a[0:2) -> r[2:4) -> d[4:6)"), client.last_route
    assert torch.equal(got, local_model.generate(prompt, **KWARGS))
    assert client.last_failovers == []  # a failed push is not a failed peer
    # The first step: a's push to r is refused, r's to d is never acked; the client relays both
    # hops for 4 steps, then lets the pushes try again at the 5th (they fail again, and the
    # next try would be at the 13th of these 12 steps).
    assert client.last_hop_steps == {"sent": 3 * NEW_TOKENS, "pushed": 0, "push_failed": 4}


def test_failover_of_a_middle_peer_with_push_is_exact(push_swarm, client, local_model):
    _, _, peers = push_swarm
    avoid(client, "d", "e", "b2")  # the middle hop is b or r; the other one takes over
    prompt = _prompt(3)
    kill = SignalHopPeer(client, peers, tokens=5, hop=1)  # the middle one
    got = client.generate(prompt, stopping_criteria=StoppingCriteriaList([kill]), **KWARGS)
    assert kill.victim in ("b", "r"), client.last_route
    assert torch.equal(got, local_model.generate(prompt, **KWARGS)), client.last_route
    (failover,) = client.last_failovers
    assert failover.peer == kill.victim and kill.victim not in client.last_route
    assert client.last_hop_steps["pushed"] > 0


def test_a_peer_pushing_other_bytes_than_it_returns_is_seen_and_not_pushed_from(client, local_model):
    """e pushes b (or b2) a noisy output and returns the client an honest one: the next hop's
    commitment names the input it got, so the client sees the mismatch. It replaces the
    sessions built on the pushed bytes (the next hop's, and the one after it, which took that
    hop's push) without banning their peers, who cannot be told from the liar, and feeds the
    hop after e itself from then on. The output is exact."""
    avoid(client, "a", "r", "d")  # e -> b or b2 -> c
    prompt = _prompt(4)
    began = time.monotonic()
    got = client.generate(prompt, **KWARGS)
    assert torch.equal(got, local_model.generate(prompt, **KWARGS)), client.last_route
    failovers = client.last_failovers
    assert 1 <= len(failovers) <= 2, [(f.peer, f.error) for f in failovers]
    assert all("computed on an input other" in f.error for f in failovers), failovers
    assert time.monotonic() - began < 30  # no retry budget was waited out
    assert client.last_route.startswith("e[0:2)"), client.last_route
    assert client.last_route.startswith("e[0:2)"), client.last_route
