"""Disaggregated prefill and decode on a real swarm (HexGen-2's serving model).

A swarm of its own on the 6-block tiny model: a prefill peer `p` [0:6); decode peers `d`, `e`
and `r` [0:6), `r` refusing every prefill peer's keys and values. A client's
prompt runs through a prefill chain, whose peers send each layer's keys and values straight to
the decode peers; decoding goes on there. The output equals local generate() exactly, and when
a decode peer dies before the keys and values reach it, the request is served colocated,
still exactly.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.conftest import swarm_of

pytestmark = pytest.mark.integration

LAYOUT = {
    "p": ("0:6", ("--role", "prefill")),
    "d": ("0:6", ("--role", "decode")),
    "e": ("0:6", ("--role", "decode")),
    # refuses every prefill peer's keys and values (a test-only fault), as a dying peer would
    "r": ("0:6", ("--role", "decode", "--debug-push", "refuse")),
}
KWARGS = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)


@pytest.fixture(scope="module")
def roles_swarm(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama")
    with swarm_of(model_dir, tmp_path_factory.mktemp("roles"), LAYOUT) as (local, peers):
        yield local, model_dir, peers


@pytest.fixture(scope="module")
def local_model(roles_swarm):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(roles_swarm[1])


@pytest.fixture
def client(roles_swarm):
    from hexswarm.client import DistributedModelForCausalLM

    local, model_dir, _ = roles_swarm
    model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers)
    avoid(model, "r")  # the tests that want it say so
    yield model
    model.shutdown()


def avoid(model, *names: str) -> None:
    """Leaves peers out of the client's routes (its own list of peers it distrusts)."""
    records = model.swarm.online_records(model.spec.model_id, model.spec.num_blocks)
    model.swarm.distrusted = {r.peer_id for r in records if r.name in names}


def prompt(seed: int, tokens: int = 24) -> torch.Tensor:
    return torch.randint(3, 400, (1, tokens), generator=torch.Generator().manual_seed(seed))


def test_the_prompt_is_prefilled_on_one_peer_and_decoded_on_another_exactly(client, local_model):
    for seed in range(3):
        got = client.generate(prompt(seed), **KWARGS)
        prefill, decode = client.last_route.split(" => ")
        assert prefill == "p[0:6)" and decode in ("d[0:6)", "e[0:6)"), client.last_route
        assert torch.equal(got, local_model.generate(prompt(seed), **KWARGS))


def test_speculative_passes_roll_decode_peers_back_into_the_prompt_they_were_pushed(client, local_model):
    """The first pass (prompt and drafts) is prefilled on p; its rejected drafts are among the
    keys and values the decode peer took, and the next pass rolls them back there."""
    repetitive = prompt(13, tokens=8).repeat(1, 3)
    drafted, kept = client.drafts.drafted, client.drafts.kept
    got = client.generate(repetitive, **KWARGS, prompt_lookup_num_tokens=4)
    assert client.last_route.startswith("p[0:6) => "), client.last_route
    assert torch.equal(got, local_model.generate(repetitive, **KWARGS))
    assert client.drafts.drafted - drafted > client.drafts.kept - kept  # some were rejected


def test_the_roles_are_in_the_records(client):
    client.swarm.distrusted = set()
    records = client.swarm.online_records(client.spec.model_id, client.spec.num_blocks)
    assert {r.name: r.role for r in records} == {"p": "prefill", "d": "decode", "e": "decode", "r": "decode"}


def test_a_batch_of_sequences_is_disaggregated_exactly(client, local_model):
    batch = torch.cat([prompt(7), prompt(8)])
    got = client.generate(batch, **KWARGS)
    assert " => " in client.last_route
    assert torch.equal(got, local_model.generate(batch, **KWARGS))


def test_keys_and_values_from_a_peer_that_was_not_the_prefill_peer_are_refused(client):
    """A decode session names its prefill peers; anyone else's KV_PUSH gets UNKNOWN_SESSION, the
    same answer as for a session that does not exist, and the session keeps waiting."""
    from hexswarm.client.worker import run_sync
    from hexswarm.swarm.wire.protocol import ErrorCode, KvPush, Open, Opened, PushAck

    records = {r.name: r for r in client.swarm.online_records(client.spec.model_id, client.spec.num_blocks)}
    kv_from = (records["p"].peer_id,)

    async def push_as_a_stranger():
        conn = await client.swarm.open_connection(records["d"].peer_id, "d", timeout=10)
        try:
            await conn.request(
                Open("victim", client.spec.model_id, 0, 6, 32, 1, "float32", kv_from=kv_from), Opened
            )
            keys = torch.zeros(1, 1, 2, 4, 16)  # the sender is checked before anything else
            return await conn.request(KvPush("victim", 0, keys, keys), PushAck)
        finally:
            conn.close()

    reply = run_sync(push_as_a_stranger(), timeout=30)
    assert reply.code == ErrorCode.UNKNOWN_SESSION and "takes keys and values" in reply.message


def test_keys_and_values_the_decode_peer_refuses_fall_back_to_colocated_exactly(client, local_model):
    avoid(client, "d", "e")  # the decode chain can only be r
    got = client.generate(prompt(11), **KWARGS)
    assert " => " not in client.last_route, client.last_route  # served colocated, by p or r
    assert torch.equal(got, local_model.generate(prompt(11), **KWARGS))


def test_a_dead_decode_peer_falls_back_to_colocated_exactly(client, local_model, roles_swarm):
    """Runs last: it kills e. Its record still says online, so the client routes to it and
    finds it dead while opening the decode chain."""
    import os
    import signal

    _, _, peers = roles_swarm
    avoid(client, "d", "r")
    os.kill(peers["e"].popen.pid, signal.SIGKILL)
    peers["e"].popen.wait(timeout=30)
    got = client.generate(prompt(12), **KWARGS)
    assert " => " not in client.last_route and "e[" not in client.last_route, client.last_route
    assert torch.equal(got, local_model.generate(prompt(12), **KWARGS))


def test_a_disaggregated_coordinator_gives_auto_peers_their_roles(make_model, tmp_path):
    """Two `--layers auto --role auto` peers and `hexswarm coordinator --disaggregated`: the plan
    makes one a prefill and the other a decode replica of the whole model; clients then
    disaggregate, exactly."""
    import sys
    import time

    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM
    from hexswarm.swarm.models.model_spec import load_model_spec
    from hexswarm.swarm.tools.launcher import LOOPBACK, LocalSwarm
    from hexswarm.swarm.trust.records import read_peer_records

    model_dir = make_model(arch="llama")
    model_id = load_model_spec(model_dir).model_id
    flags = ("--announce-period", "1", "--rebalance-period", "3", "--move-wait", "10", "--role", "auto")
    with LocalSwarm(tmp_path) as local:
        local.start_bootstrap()
        coordinator = [
            sys.executable,
            "-m",
            "hexswarm",
            "coordinator",
            "--initial-peers",
            *local.initial_peers,
        ]
        # forced: on two CPU peers the chooser keeps the colocated plan (it serves more tokens/s)
        coordinator += [
            "--model",
            str(model_dir),
            "--host-maddrs",
            LOOPBACK,
            "--disaggregated",
            "--force-disaggregated",
        ]
        coordinator += ["--lease-ttl", "6", "--coordinator-period", "1", "--debounce", "2", "--budget-s", "2"]
        local.start_command("coordinator", coordinator, ready="coordinator candidate")
        local.start_peers(model_dir, {"a": ("auto", flags), "b": ("auto", flags)})
        client = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers)
        try:
            deadline = time.monotonic() + 120
            while True:
                roles = {
                    r.name: (r.role, r.start, r.end) for r in read_peer_records(client.swarm.dht, model_id)
                }
                if sorted(role for role, _, _ in roles.values()) == ["decode", "prefill"]:
                    break
                assert time.monotonic() < deadline, f"no roles within 120 s: {roles}"
                time.sleep(1)
            assert all((start, end) == (0, 6) for _, start, end in roles.values()), roles
            local_model = AutoModelForCausalLM.from_pretrained(model_dir)
            got = client.generate(prompt(21), **KWARGS)
            assert " => " in client.last_route, client.last_route
            assert torch.equal(got, local_model.generate(prompt(21), **KWARGS))
        finally:
            client.shutdown()


def test_role_auto_needs_layers_auto(make_model):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "hexswarm.peer.cli", str(make_model(arch="llama")), "--layers", "0:2",
         "--role", "auto", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "--role auto needs --layers auto" in result.stderr
