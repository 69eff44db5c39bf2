"""Peers behind NAT against peers on the "internet", in network namespaces (swarm/nat/netlab.py).

SmolLM2-135M-Instruct, layers 0:15 and 15:30. A bootstrap on the internet relays; the client
sits in home 3 behind its own NAT. The same run serves the chain twice: first with the two peers
at home (homes 1 and 2, behind NAT: relayed through the bootstrap's ports), then with two peers
on the internet (direct). Prints one JSON line per case:

- `hop_ms_direct` / `hop_ms_relayed`: median PING round trip from the client to the 0:15 peer
  over its session stream (the transport alone: no layer runs).
- `ms_per_token_direct` / `ms_per_token_relayed`: greedy decode after the first token, through
  the whole chain (pushes on, the default: home 1 pushes to home 2 through the relay).
- `reachability_known_s`, `relay_reserved_s`: from the home peer's start until its dial-back
  answered, and until a relay's port for it was confirmed (its log); `online_s_behind_nat`: from
  its start until it logged `online:`.
- `prompt_bytes_per_hop`: the prompt's hidden states, to show they pass libp2p's 128 KiB relay
  limit, which would reset the connection (swarm/nat/port_relay.py).
- `exact`: both chains' greedy tokens equal local transformers'.

Case `wan` then gives every home an internet link: upload capped at 100 Mbit/s (tc tbf) and
`--delay-ms` (25) added each way to every connection a home opens (this kernel has no netem: a
delay proxy in each home router, swarm/nat/netlab.py), and measures the relayed chain again on
fresh peers, against the same chain without it (`ms_per_token_relayed_lan`).

Needs root, iproute2 and iptables. Run: python benchmarks/public_swarm.py [--new-tokens 24] [--save]
(--save: also write the lines to benchmarks/results/public_swarm.json)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm.tools.launcher)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_results import save  # noqa: E402
from real_model import TEXT, decode_ms  # noqa: E402

from hexswarm.swarm.models import gguf_checkpoint  # noqa: E402
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL  # noqa: E402
from hexswarm.swarm.nat import netlab
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402

ANY = "/ip4/0.0.0.0/tcp/0"
PROMPT_TOKENS = 160


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=25.0, help="one way, on each home's link")
    parser.add_argument("--mbit", type=float, default=100.0, help="each home's upload")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/public_swarm.json")
    args = parser.parse_args()
    why_not = netlab.available()
    if why_not:
        sys.exit(f"public_swarm: {why_not}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)
    gguf_checkpoint.materialize_all(spec.path)  # every weight file, for the local baseline
    ids = AutoTokenizer.from_pretrained(spec.path)(TEXT, return_tensors="pt").input_ids[:, :PROMPT_TOKENS]
    local = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    expected = local.generate(
        ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False
    )
    hidden = local.config.hidden_size
    del local
    base = {
        "bench": "public_swarm",
        "model": spec.model_id,
        "prompt_bytes_per_hop": PROMPT_TOKENS * hidden * 4,
    }
    with tempfile.TemporaryDirectory(prefix="hexswarm-nat-") as tmp, netlab.NetLab(homes=3) as net:
        with LocalSwarm(Path(tmp)) as swarm:
            public = net.exec_prefix(net.public_ns)
            swarm.start_bootstrap(
                60, launcher=public, host_maddrs=ANY, address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/"
            )
            home = start_pair(swarm, spec.path, net.home(1).host_ns, net.home(2).host_ns, net, "home")
            relayed = measure(swarm, net, spec, ids, expected, "home", args)
            stop_all(swarm, home)
            inet = start_pair(swarm, spec.path, net.public_ns, net.public_ns, net, "inet")
            direct = measure(swarm, net, spec, ids, expected, "inet", args)
            stop_all(swarm, inet)
            for i in (1, 2, 3):
                net.shape(net.home(i).router_ns, "wan0", args.mbit)
                net.delay_home(i, args.delay_ms, port=7070)
            wan_home = start_pair(swarm, spec.path, net.home(1).host_ns, net.home(2).host_ns, net, "wan")
            wan = measure(swarm, net, spec, ids, expected, "wan", args)
        timings = {"lan": start_times(home["home-left"]), "wan": start_times(wan_home["wan-left"])}
    wan_case = f"wan-{args.mbit:g}mbit-{2 * args.delay_ms:g}ms-rtt-per-home-link"
    lines = []
    for case, measured, timing in (("lan", relayed, timings["lan"]), (wan_case, wan, timings["wan"])):
        line = {
            **base,
            "case": case,
            "ms_per_token_relayed_lan": relayed["ms_per_token"],
            "hop_ms_direct": direct["hop_ms"],
            "hop_ms_relayed": measured["hop_ms"],
            "hop_ms_added": round(measured["hop_ms"] - direct["hop_ms"], 3),
            "ms_per_token_direct": direct["ms_per_token"],
            "ms_per_token_relayed": measured["ms_per_token"],
            **timing,
            "chain_relayed": measured["chain"],
            "chain_direct": direct["chain"],
            "exact": measured["exact"] and direct["exact"],
        }
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.save:
        save("public_swarm", {"bench": "public_swarm", "lines": lines})


def start_pair(swarm: LocalSwarm, model, left_ns: str, right_ns: str, net, prefix: str) -> dict:
    """Peers `{prefix}-left` [0:15) and `{prefix}-right` [15:30), started at once, each once online."""
    peers = {}
    for name, layers, ns in ((f"{prefix}-left", "0:15", left_ns), (f"{prefix}-right", "15:30", right_ns)):
        peers[name] = swarm.start_peer(
            model, layers, name, "--host-maddrs", ANY, wait=False, launcher=net.exec_prefix(ns)
        )
        peers[name].started = time.monotonic()
    for proc in peers.values():
        swarm.wait_for_log(proc, "online:", 300)
        proc.online_s = time.monotonic() - proc.started
    return peers


def stop_all(swarm: LocalSwarm, peers: dict) -> None:
    for proc in peers.values():
        swarm.stop(proc)


def start_times(proc) -> dict:
    found = re.search(r"reachability known ([\d.]+) s, relay slot confirmed ([\d.]+) s", proc.log())
    return {
        "reachability_known_s": float(found.group(1)) if found else None,
        "relay_reserved_s": float(found.group(2)) if found else None,
        "online_s_behind_nat": round(proc.online_s, 1),
    }


def measure(swarm: LocalSwarm, net, spec, ids, expected, prefix: str, args) -> dict:
    """A fresh client in home 3: ping round trips to the left peer, then the chain's decode."""
    from hexswarm.client import DistributedModelForCausalLM

    torch.zeros(1).share_memory_()  # torch's shm manager in this namespace (tests/.../test_public_swarm.py)
    with netlab.inside(net.home(3).host_ns):
        model = DistributedModelForCausalLM.from_pretrained(spec.path, initial_peers=swarm.initial_peers)
    try:
        peer_id = wait_for_pair(model, f"{prefix}-left", f"{prefix}-right")
        hop_ms = ping_ms(model, peer_id, args.pings)
        out, ms = decode_ms(model, ids, args.new_tokens, args.repeats)
        if not model.last_route.startswith(f"{prefix}-left["):
            raise RuntimeError(f"the chain did not start at {prefix}-left: {model.last_route}")
        return {
            "hop_ms": round(hop_ms, 3),
            "ms_per_token": round(ms, 2),
            "exact": bool(torch.equal(out, expected)),
            "chain": model.last_route,
        }
    finally:
        model.shutdown()


def wait_for_pair(model, left: str, right: str, timeout: float = 60) -> str:
    """`left`'s peer id once peers `left` and `right` are both online in the client's view."""
    from hexswarm.swarm.trust.records import PeerState, read_peer_records

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = {r.name: r for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
        if all(name in records and records[name].state == PeerState.ONLINE for name in (left, right)):
            return records[left].peer_id
        time.sleep(0.5)
    raise RuntimeError(f"{left} and {right} were not online within {timeout} s")


def ping_ms(model, peer_id: str, count: int) -> float:
    """Median PING round trip over one session stream (dialed at the record's addresses)."""
    from hexswarm.client.worker import run_sync

    async def pings() -> list[float]:
        conn = await model.swarm.open_connection(peer_id, "under-test", 30)
        try:
            for _ in range(10):
                await conn.ping()
            return [await conn.ping() for _ in range(count)]
        finally:
            conn.close()

    model.swarm.online_records(model.spec.model_id, model.spec.num_blocks)  # learn the addresses
    return statistics.median(run_sync(pings(), timeout=120))


if __name__ == "__main__":
    main()
