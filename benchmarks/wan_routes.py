"""Routes for the WAN: a pushed chain priced by the links it crosses, against the client's round trips alone.

Six hosts in network namespaces with no NAT (swarm/nat/netlab.py `add_host`): the bootstrap, two
peers with SmolLM2-135M-Instruct's first half (`a1`, `a2`: blocks 0:15), two with its second
half (`b1`, `b2`: 15:30) and the client. Two regions, west (`a1`, `b1`) and east (`a2`, `b2`),
`--near` ms apart one way inside a region and `--far` across; the client sits between them,
`--client-near` ms from `a2` and `b1` and `--client-far` from `a1` and `b2`. Every connection a
host opens to another goes through a delay proxy that adds the pair's delay each way
(`delay_host(per_destination=...)`), so a pair's round trip is twice its delay whoever dials.

Priced by the client's round trips alone (every chain before links were priced), `a2 -> b1` is the
nearest chain; but a pushed step crosses client -> a2 -> b1 -> client, and a2 -> b1 is the far
link. Priced by the links the peers measured (routing/chains/peer_links.py), `a1 -> b1` or
`a2 -> b2` win. Both pricings run alternately on the same swarm and client (the old one by
turning the measured links off in the client's cost, `cost.follow_matrix`, and taking a fresh
view version so the router's cache is not reused), chat workload, greedy, `--repeats` times.
The client routes with `--routing` (default `min_latency`, stateless: the trade-off router's
default also counts the client's own earlier picks on a snapshot as load, which spreads
back-to-back sessions over near-equal chains and blurs what the pricing alone does).

A first JSON line of what the client measured (its round trips to each peer, and the links the
peers' records report), then one per pricing: `pricing` (`relayed` or `links`), `ms_per_token` (median after the
first token), `ttft_s`, `chains` (the chains the sessions took, with how often), `exact`
(every output equal to local transformers' greedy output); then a summary line with the ratio.

Needs root, iproute2 and iptables. Run:
    python benchmarks/wan_routes.py [--repeats 3] [--new-tokens 32] [--save]
(--save: also write the lines to benchmarks/results/wan_routes.json, or wan_routes_ROUTING.json
for another --routing).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm.tools.launcher)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_results import save  # noqa: E402
from wan import Run, model_and_prompts, start_swarm  # noqa: E402

from hexswarm.routing.chains import cost  # noqa: E402
from hexswarm.swarm.nat import netlab  # noqa: E402
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402

PEERS = {"a1": "0:15", "a2": "0:15", "b1": "15:30", "b2": "15:30"}
REGION = {"a1": "west", "b1": "west", "a2": "east", "b2": "east"}
ANNOUNCE_PERIOD_S = 5  # so that measured links reach the records within a few periods


def one_way_ms(x: str, y: str, args) -> float:
    """The delay between hosts x and y (either order)."""
    if "client" in (x, y):
        other = y if x == "client" else x
        if other == "bootstrap":
            return args.client_near
        return args.client_near if other in ("a2", "b1") else args.client_far
    if "bootstrap" in (x, y):
        return args.client_near
    return args.near if REGION[x] == REGION[y] else args.far


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--near", type=float, default=5.0, help="one way inside a region, ms")
    parser.add_argument("--far", type=float, default=40.0, help="one way across regions, ms")
    parser.add_argument("--client-near", type=float, default=20.0, help="client to a2 and b1, ms")
    parser.add_argument("--client-far", type=float, default=25.0, help="client to a1 and b2, ms")
    parser.add_argument("--routing", default="min_latency", help="the client's routing mode")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/wan_routes.json")
    args = parser.parse_args()
    why_not = netlab.available()
    if why_not:
        sys.exit(f"wan_routes: {why_not}")
    spec, prompts, expected = model_and_prompts(args.new_tokens, ("chat",))
    lines = run(spec, prompts["chat"], expected["chat"], args)
    for line in lines:
        print(json.dumps(line), flush=True)
    by = {line["pricing"]: line["ms_per_token"] for line in lines if "pricing" in line}
    summary = {"bench": "wan_routes", "links_over_relayed": round(by["links"] / by["relayed"], 3)}
    print(json.dumps(summary), flush=True)
    if args.save:
        delays = {k: getattr(args, k) for k in ("near", "far", "client_near", "client_far")}
        name = "wan_routes" if args.routing == "min_latency" else f"wan_routes_{args.routing}"
        save(name, {"bench": "wan_routes", "one_way_ms": delays, "lines": lines, "summary": summary})


def run(spec, prompts, expected, args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="hexswarm-wan-routes-") as tmp, netlab.NetLab(homes=0) as net:
        hosts = {"bootstrap": (net.public_ns, netlab.PUBLIC_HOST_IP)}
        hosts.update({name: net.add_host(k) for k, name in enumerate([*PEERS, "client"], start=1)})
        for name, (ns, ip) in hosts.items():
            per = {hosts[o][1]: one_way_ms(name, o, args) for o in hosts if o != name}
            net.delay_host(ns, ip, args.client_near, per_destination=per)
        with LocalSwarm(Path(tmp)) as swarm:
            start_swarm(swarm, net, hosts, spec, PEERS, "--announce-period", str(ANNOUNCE_PERIOD_S))
            return measure(swarm, hosts["client"][0], spec, prompts, expected, args)


def measure(swarm: LocalSwarm, client_ns: str, spec, prompts, expected, args) -> list[dict]:
    from hexswarm.client import DistributedModelForCausalLM

    torch.zeros(1).share_memory_()  # torch's shm manager in this namespace (see netlab.inside)
    with netlab.inside(client_ns):
        model = DistributedModelForCausalLM.from_pretrained(
            spec.path, initial_peers=swarm.initial_peers, routing=args.routing
        )
    try:
        waited = wait_for_links(model, timeout=120)
        print(f"[wan_routes] every cross link measured after {waited:.0f} s", file=sys.stderr, flush=True)
        seen = measured(model)
        runs = {"relayed": Run(), "links": Run()}
        chains = {name: collections.Counter() for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                with priced(model, name):
                    for ids, want in zip(prompts, expected, strict=True):
                        run.generate(model, ids, want, args.new_tokens, speculate=False)
                        chains[name][model.last_route] += 1
        return [seen, *(line_of(name, run, chains[name], model) for name, run in runs.items())]
    finally:
        model.shutdown()


@contextlib.contextmanager
def priced(model, pricing: str):
    """Routes priced with the peers' measured links, or as before them (client round trips only)."""
    model.swarm._last_snapshot = None  # a new view version: the router's cached fronts are not reused
    if pricing == "links":
        yield
        return
    measured = cost.follow_matrix
    cost.follow_matrix = lambda *_: None
    try:
        yield
    finally:
        cost.follow_matrix = measured


def wait_for_links(model, timeout: float) -> float:
    """Seconds until every first-half peer's record reports its round trip to every second-half peer."""
    from hexswarm.swarm.trust.records import links_by_peer, read_peer_records

    began = time.monotonic()
    while time.monotonic() - began < timeout:
        records = {r.name: r for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
        ids = {name: r.peer_id for name, r in records.items()}
        names = {peer_id: name for name, peer_id in ids.items()}
        reported = {
            (names[peer], other)
            for peer, links in links_by_peer(list(records.values()))
            for other, _ in links
        }
        if len(ids) == len(PEERS) and all(
            (a, ids[b]) in reported or (b, ids[a]) in reported for a in ("a1", "a2") for b in ("b1", "b2")
        ):
            return time.monotonic() - began
        time.sleep(1.0)
    raise RuntimeError(f"the peers' records did not report their links within {timeout} s")


def measured(model) -> dict:
    """What the client sees: its round trips to each peer, and the links the records report (ms)."""
    from hexswarm.routing.chains.peer_links import links_from_reports
    from hexswarm.swarm.trust.records import links_by_peer, read_peer_records

    records = [r for r in read_peer_records(model.swarm.dht, model.spec.model_id) if r.name in PEERS]
    names = {r.peer_id: r.name for r in records}
    rtts = model.swarm.round_trips(records)
    links = links_from_reports(links_by_peer(records))
    return {
        "bench": "wan_routes",
        "client_rtt_ms": {
            names[p]: round(ms, 1) for p, ms in sorted(rtts.items(), key=lambda i: names[i[0]])
        },
        "links_ms": {
            f"{names[a]}-{names[b]}": round(ms, 1)
            for (a, b), ms in links.items()
            if a in names and b in names
        },
    }


def model_routing(model) -> str:
    return type(model.router).__name__


def line_of(pricing: str, run: Run, chains: collections.Counter, model) -> dict:
    line = run.line("chat", False, 0.0, 0.0, model)
    return {
        "bench": "wan_routes",
        "pricing": pricing,
        "routing": model_routing(model),
        "ms_per_token": line["ms_per_token"],
        "ttft_s": line["ttft_s"],
        "chains": dict(chains),
        "exact": line["exact"],
    }


if __name__ == "__main__":
    main()
