"""One machine posing as many, across real networks (swarm/nat/netlab.py namespaces): identities
from one home's address share one IP group's allowance of a peer's sessions (peer/admission.py),
while a client from another home is served exactly. Nothing is mocked: real p2pd daemons behind
a MASQUERADE router, a real peer on the "internet"."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hexswarm.client.swarm_client import SwarmClient
from hexswarm.client.worker import run_sync
from hexswarm.swarm.nat import netlab
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import SESSION_PROTOCOL, Error, ErrorCode, Open, Opened

pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.slow]

WHY_NOT = netlab.available()
if WHY_NOT:
    pytest.skip(f"Sybil tests need network namespaces: {WHY_NOT}", allow_module_level=True)

ANY = "/ip4/0.0.0.0/tcp/0"
SESSIONS_PER_REMOTE = 2  # so one IP group may hold 4 (AdmissionLimits.group_factor 2)
SYBILS = 5


async def _open_sessions(sybil: SwarmClient, peer_id: str, model_id: str, count: int, held: list) -> list:
    """`count` sessions on the peer, each on its own stream (kept open in `held`); the replies."""
    replies = []
    for i in range(count):
        reader, writer = await sybil.dialer.open_stream(peer_id, SESSION_PROTOCOL)
        held.append(writer)  # a session lives as long as its stream
        await write_frame(writer, Open(f"sybil-{i}", model_id, 0, 2, 64, 1, "float32"))
        replies.append(await asyncio.wait_for(read_frame(reader), 30))
    return replies


def test_identities_from_one_home_share_one_allowance(make_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch="llama", layers=2, seed=41)
    expected = AutoModelForCausalLM.from_pretrained(model_dir).generate(
        torch.tensor([[4, 8, 15, 16]]), max_new_tokens=6, do_sample=False
    )
    torch.zeros(1).share_memory_()  # torch's shared-memory manager, before entering a namespace
    with netlab.NetLab(homes=2) as net, LocalSwarm(tmp_path) as local:
        public = net.exec_prefix(net.public_ns)
        local.start_bootstrap(
            60, launcher=public, host_maddrs=ANY, address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/"
        )
        local.start_peer(
            model_dir, "0:2", "target", "--host-maddrs", ANY, "--announce-period", "2",
            "--max-sessions", "16", "--max-sessions-per-peer", str(SESSIONS_PER_REMOTE),
            launcher=public, timeout=120,
        )  # fmt: skip
        local.start_peer(
            model_dir,
            "0:2",
            "twin",
            "--host-maddrs",
            ANY,
            "--announce-period",
            "2",
            launcher=public,
            timeout=120,
        )  # another identity on the target's machine
        sybils, streams = [], []
        try:
            with netlab.inside(net.home(1).host_ns):
                sybils = [SwarmClient.connect(local.initial_peers) for _ in range(SYBILS)]
            target = _target(sybils[0], model_dir)
            replies = []
            for sybil in sybils:
                sybil.dialer.learn([target])
                replies += run_sync(
                    _open_sessions(sybil, target.peer_id, target.model_id, SESSIONS_PER_REMOTE, streams),
                    timeout=60,
                )
            opened = [r for r in replies if isinstance(r, Opened)]
            refused = [r for r in replies if isinstance(r, Error)]
            assert len(opened) == 2 * SESSIONS_PER_REMOTE, replies  # one group's allowance
            assert refused and all(
                r.code == ErrorCode.REMOTE_LIMIT and "IP group" in r.message for r in refused
            )

            _a_router_sees_one_record_of_the_machine(sybils[0], model_dir)

            with netlab.inside(net.home(2).host_ns):  # another home: its own allowance
                client = DistributedModelForCausalLM.from_pretrained(
                    model_dir, initial_peers=local.initial_peers, coverage_timeout=60
                )
            try:
                out = client.generate(torch.tensor([[4, 8, 15, 16]]), max_new_tokens=6, do_sample=False)
                assert torch.equal(out, expected)
            finally:
                client.shutdown()
        finally:
            for sybil in sybils:
                sybil.shutdown()


def _a_router_sees_one_record_of_the_machine(swarm: SwarmClient, model_dir) -> None:
    """Both peers run on the public host: one IP group, so a client capped at one record per
    group per block (client/group_cap.py) routes through one of them, and pings only it."""
    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(model_dir)
    records = swarm.online_records(spec.model_id, spec.num_blocks)
    assert {r.name for r in records} == {"target", "twin"}
    assert len(swarm.view(records, spec.num_blocks, spec.hidden_size).peers) == 2  # the default cap is 4
    swarm.records_per_group, swarm.rtt_ms = 1, {}
    assert len(swarm.view(records, spec.num_blocks, spec.hidden_size).peers) == 1
    assert len(swarm.rtt_ms) == 1


def _target(swarm: SwarmClient, model_dir):
    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(model_dir)
    (record,) = [r for r in read_peer_records(swarm.dht, spec.model_id) if r.name == "target"]
    return record
