"""The `sybil_one_group` phase of benchmarks/hostile.py: 20 identities from one IP group.

IP groups need real addresses, so this phase builds its own networks (swarm/nat/netlab.py, as root):
a bootstrap and two honest peers of every block on the "internet", the honest clients in home 2,
and the attacker in home 1, all of whose identities leave through one MASQUERADE router and so
share one /24. It measures the honest load alone, then with the attacker: each identity runs
prefill loops of --max-length tokens on both peers at once (benchmarks/hostile_actor.py sybil).
Its p99 ratio is over its own attacker-free run, on the same networks.

With `behind_nat` (the `nat_sybil` phase), the two peers run in homes 3 and 4 instead, behind NAT
and relayed through the bootstrap's ports: every remote reaches them through a tunnel from
loopback, and their per-group limits must see each remote's real address (its relay's word).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time

import torch

from hexswarm.swarm.nat import netlab
from hexswarm.swarm.tools.launcher import LocalSwarm

ANY = "/ip4/0.0.0.0/tcp/0"
IDENTITIES = 20
LOOPS_PER_PEER = 2  # prefill loops per identity and peer (each on a stream of its own)


def run_sybil_phase(
    bench, honest_load, summarize, actor_path: str, hop_cost, behind_nat: bool = False
) -> dict:
    """{"baseline": ..., "attack": ..., "p99_ratio": ...}, or {"skipped": why} without namespaces."""
    why_not = netlab.available()
    if why_not:
        return {"skipped": f"needs network namespaces: {why_not}"}
    torch.zeros(1).share_memory_()  # torch's shared-memory manager, before entering a namespace
    began = time.monotonic()
    with (
        netlab.NetLab(homes=4 if behind_nat else 2) as net,
        LocalSwarm(bench.workdir / f"sybil-logs{'-nat' if behind_nat else ''}", env=bench.local.env) as local,
    ):
        public = net.exec_prefix(net.public_ns)
        local.start_bootstrap(
            60, launcher=public, host_maddrs=ANY, address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/"
        )
        layers = f"0:{bench.spec.num_blocks}"
        where = [net.home(3).host_ns, net.home(4).host_ns] if behind_nat else [net.public_ns] * 2
        peers = [
            local.start_peer(
                bench.model, layers, name, "--host-maddrs", ANY, "--announce-period", "2",
                launcher=net.exec_prefix(ns), wait=False,
            )
            for name, ns in zip(("g0", "g1"), where, strict=True)
        ]  # fmt: skip
        for peer in peers:
            local.wait_for_log(peer, "online:", 300)
        with _honest_model(bench, net, local) as model:
            honest_load(bench, model, 5.0)  # warm-up, not measured
            marks = [len(p.log()) for p in peers]
            baseline = summarize(honest_load(bench, model, bench.args.seconds))
            baseline["hop_ms"] = hop_cost(peers, marks)
            with _attacker(bench, net, local, actor_path) as evidence:
                marks = [len(p.log()) for p in peers]
                attack = summarize(honest_load(bench, model, bench.args.seconds))
                attack["hop_ms"] = hop_cost(peers, marks)
    attack["evidence"] = evidence
    ratio = attack["p99_ms"] / baseline["p99_ms"] if attack["p99_ms"] and baseline["p99_ms"] else None
    reach = [re.search(r"reachable directly|relay slot confirmed|unreachable", p.log()) for p in peers]
    return {
        "identities": IDENTITIES,
        "victims": [m.group(0) if m else None for m in reach],
        "baseline": baseline,
        "attack": attack,
        "p99_ratio": round(ratio, 2) if ratio else None,
        "counts": {"attacker_prefills": evidence.get("prefills")},
        "phase_s": round(time.monotonic() - began, 1),
    }


@contextlib.contextmanager
def _honest_model(bench, net, local):
    from hexswarm.client import DistributedModelForCausalLM

    with netlab.inside(net.home(2).host_ns):
        model = DistributedModelForCausalLM.from_pretrained(
            bench.model, initial_peers=local.initial_peers, coverage_timeout=60
        )
    try:
        yield model
    finally:
        model.shutdown()


@contextlib.contextmanager
def _attacker(bench, net, local, actor_path: str):

    out = local.workdir / "actor-sybil.json"  # one per phase: sybil_one_group, nat_sybil
    args = [*net.exec_prefix(net.home(1).host_ns), sys.executable, actor_path, "sybil"]
    args += ["--initial-peers", *local.initial_peers, "--model", str(bench.model), "--targets", "g0", "g1"]
    args += ["--identities", str(IDENTITIES), "--streams", str(LOOPS_PER_PEER)]
    args += ["--max-length", str(bench.args.max_length), "--out", str(out)]
    with actor_process(local, "actor-sybil", args, out, timeout=600) as evidence:
        yield evidence


@contextlib.contextmanager
def actor_process(local, name: str, args: list[str], out, timeout: float):
    """An attacker process, started until it says "attacking" and stopped after the block; yields
    the dict that its --out JSON (what it saw) fills once it stopped."""
    import json

    proc = local.start_command(name, args, ready="attacking", timeout=timeout)
    evidence: dict = {}
    try:
        yield evidence
    finally:
        local.stop(proc)
    try:
        evidence.update(json.loads(out.read_text()))
    except (OSError, ValueError):
        evidence["actor_failed"] = proc.log()[-1500:]
