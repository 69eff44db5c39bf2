"""A tensor-parallel auto peer follows a plan that moves it, with real processes on 127.0.0.1.

A bootstrap, fixed peers on 0:4 and 4:8 of an 8-block tiny model, and a `--layers auto --tp auto
--devices cpu,cpu` peer, which offers degrees 1 and 2. This test's own DHT node holds the
coordinator lease (a real, signed lease) and publishes plans: v1 moves the TP peer to the other
half of the model at tp 2 (the peer loads the new range on both ranks while serving the old
one, switches, and drops the old range), v2 keeps the range and changes the degree to 1 (the
leader loads whole layers beside its shard, measures them and switches). Then the fixed peer of
its new range is killed, so a generation must pass through the moved peer, and it equals the
local model's token for token.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from hexswarm.swarm.coordinator.records import Assignment, Lease, PlanRecord, lease_key, plan_key
from hexswarm.swarm.tools.launcher import LOOPBACK, LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records
from tests.integration.test_coordinator import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

BLOCKS = 8
FLAGS = ("--announce-period", "1", "--rebalance-period", "1000", "--move-wait", "20", "--drain-timeout", "5")


def test_a_tp_peer_moves_to_its_planned_range_and_serves_it_exactly(make_model, tmp_path_factory):
    from hivemind.utils import get_dht_time
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM
    from hexswarm.swarm.models.model_spec import load_model_spec
    from hexswarm.swarm.net.dht import start_dht
    from hexswarm.swarm.net.identity import load_or_create_identity

    model_dir = make_model(arch="llama", layers=BLOCKS)
    model_id = load_model_spec(model_dir).model_id
    with LocalSwarm(tmp_path_factory.mktemp("tp_move")) as local:
        local.start_bootstrap()
        fixed = local.start_peers(model_dir, {"low": ("0:4", ()), "high": ("4:8", ())}, *FLAGS, timeout=240)
        tp_args = ("--max-blocks", "4", "--tp", "auto", "--devices", "cpu,cpu", *FLAGS)
        tp_peer = local.start_peer(model_dir, "auto", "tp", *tp_args, timeout=240)
        identity = load_or_create_identity(tmp_path_factory.mktemp("coordinator") / "id.key")
        dht = start_dht(local.initial_peers, identity, host_maddrs=[LOOPBACK])
        client = None
        try:
            me = identity.peer_id.to_base58()
            (record,) = [r for r in read_peer_records(dht, model_id) if r.auto]
            assert (record.tp, record.tp_choices, len(record.devices)) == (2, (1, 2), 2)
            assert [degree for degree, *_ in record.tp_speeds] == [1, 2]  # measured at start
            target = (4, 8) if record.start < 4 else (0, 4)
            expiration = get_dht_time() + 300
            lease = Lease(model_id, me, since=get_dht_time())
            assert dht.store(lease_key(model_id), lease.to_bytes(), expiration, subkey=identity.owner_marker)

            def publish(version: int, tp: int) -> None:
                assignment = Assignment(record.peer_id, *target, tp)
                plan = PlanRecord(model_id, version, me, "test", 1.0, 1.0, (assignment,))
                # (a later expiration each time: the DHT keeps the value with the latest one)
                expires = get_dht_time() + 300
                assert dht.store(plan_key(model_id), plan.to_bytes(), expires, subkey=identity.owner_marker)

            def serves(version: int, tp: int):
                def check():
                    mine = [r for r in read_peer_records(dht, model_id) if r.peer_id == record.peer_id]
                    return mine and (mine[0].start, mine[0].end, mine[0].tp, mine[0].plan_version) == (
                        *target,
                        tp,
                        version,
                    )

                return check

            publish(1, 2)
            wait_until(serves(1, 2), 120, f"the TP peer serves {target} at tp 2 under plan v1")
            wait_until(lambda: "dropped the old range" in tp_peer.log(), 60, "the old range is dropped")
            assert f"loaded [{target[0]}:{target[1]}) at degree 2" in tp_peer.log()

            publish(2, 1)
            wait_until(serves(2, 1), 120, f"the peer serves {target} at tp 1 under plan v2")
            wait_until(
                lambda: tp_peer.log().count("dropped the old range") == 2, 60, "the tp-2 stack is dropped"
            )
            assert f"loaded [{target[0]}:{target[1]}) at degree 1" in tp_peer.log()
            (record_now,) = [r for r in read_peer_records(dht, model_id) if r.peer_id == record.peer_id]
            assert len(record_now.devices) == 1 and record_now.tp_choices == (1, 2)

            # Only the moved TP peer serves the new range now.
            victim = fixed.pop("high" if target == (4, 8) else "low")
            os.killpg(victim.popen.pid, signal.SIGKILL)
            victim.popen.wait(10)
            prompt = torch.tensor([[3, 14, 15, 92, 65]])
            expected = AutoModelForCausalLM.from_pretrained(model_dir).generate(
                prompt, max_new_tokens=12, do_sample=False
            )
            client = DistributedModelForCausalLM.from_pretrained(
                model_dir, initial_peers=local.initial_peers, coverage_timeout=120
            )
            wait_until(
                lambda: victim.name not in {r.name for r in read_peer_records(dht, model_id)},
                30,
                "the killed peer's record expires",
            )
            assert torch.equal(client.generate(prompt, max_new_tokens=12, do_sample=False), expected)
        finally:
            if client is not None:
                client.shutdown()
            dht.shutdown()
