"""Auto peers follow a new plan when their coordinator tells them it is out (a nudge over p2p,
swarm/coordinator/nudges.py), not when they next read the DHT: here they announce and read the
plan only every 120 s, so a plan followed well within that reached them by its nudge."""

from __future__ import annotations

import re
import sys
import time

import pytest

from hexswarm.swarm.coordinator.records import read_coordination_sync
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.tools.launcher import LOOPBACK, LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

BLOCKS = 4
ANNOUNCE_PERIOD_S = 120  # longer than the wait below: the periodic read cannot be what followed
FOLLOW_BOUND_S = 60  # from the plan's publication to every auto peer following it, on a busy machine


def test_auto_peers_follow_a_new_plan_by_its_nudge(make_model, tmp_path):
    from hexswarm.swarm.models.model_spec import load_model_spec

    model_dir = make_model(arch="llama", layers=BLOCKS)
    model_id = load_model_spec(model_dir).model_id
    key = tmp_path / "coordinator.key"
    coordinator_id = load_or_create_identity(key).peer_id.to_base58()
    with LocalSwarm(tmp_path / "swarm") as local:
        local.start_bootstrap()
        peers = [
            local.start_peer(
                model_dir,
                "auto",
                f"a{i}",
                "--max-blocks",
                "2",
                "--announce-period",
                str(ANNOUNCE_PERIOD_S),
                "--coordinator-key",
                coordinator_id,
                wait=False,
            )  # fmt: skip
            for i in range(2)
        ]
        for proc in peers:
            local.wait_for_log(proc, "online:", timeout=240)
        coordinator = local.start_command(
            "coordinator",
            [
                sys.executable,
                "-m",
                "hexswarm.swarm.commands.cli",
                "coordinator",
                "--initial-peers",
                *local.initial_peers,
                "--model",
                str(model_dir),
                "--host-maddrs",
                LOOPBACK,
                "--identity",
                str(key),
                "--coordinator-key",
                coordinator_id,
                "--coordinator-period",
                "1",
                "--debounce",
                "1",
                "--budget-s",
                "1",
                "--slo-scale",
                "100",
            ],  # fmt: skip
            ready="coordinator candidate",
        )
        local.wait_for_log(coordinator, "published plan v1", timeout=120)
        published = time.monotonic()
        version = _followed_by_all(local, model_id, coordinator_id, published)
        told = re.search(rf"told (\d+) of (\d+) auto peers that plan v{version} is out", coordinator.log())
        assert told and told.group(1) == told.group(2) == "2", coordinator.log()[-2000:]
        for proc in peers:
            assert f"following plan v{version}" in proc.log()


def _followed_by_all(local: LocalSwarm, model_id: str, coordinator_id: str, since: float) -> int:
    """The version of the holder's plan once every auto peer's record says it follows it."""
    from hexswarm.swarm.net.dht import start_dht

    dht = start_dht(local.initial_peers, load_or_create_identity(None), host_maddrs=[LOOPBACK])
    try:
        while time.monotonic() - since < FOLLOW_BOUND_S:
            plan = read_coordination_sync(dht, model_id, trust=frozenset({coordinator_id})).plan
            auto = [r for r in read_peer_records(dht, model_id) if r.auto]
            if plan is not None and len(auto) == 2 and all(r.plan_version == plan.version for r in auto):
                return plan.version
            time.sleep(0.5)
    finally:
        dht.shutdown()
    raise AssertionError(
        f"the auto peers did not follow the plan within {FOLLOW_BOUND_S} s of its publication"
    )
