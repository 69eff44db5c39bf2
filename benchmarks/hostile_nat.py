"""The phases of benchmarks/hostile.py against peers behind NAT, in network namespaces
(swarm/nat/netlab.py, as root). Each builds its own networks: two bootstraps (each a relay and a
dial-back helper) on the "internet", in two /24s (netlab's public host, and a second public host
this module adds), the peers under test in homes behind NAT, the honest client (4 threads, as
the other phases) in home 2 and the attacker in home 3, one IP group. Each measures the honest
load without the attacker, then with it, on the same networks; p99_ratio is over the first.

- `relay_hold`: a relayed peer of every block in home 1. The attacker opens as many TCP
  connections to its relay ports as it is let and holds them idle, without a handshake (half
  silent, half after one byte), reopening those closed, while a fresh honest client generates
  through that peer. `connections_held`: the most it held open at once.
- `dialback_flood`: a peer of every block joins from home 1 while the attacker floods both
  bootstraps' dial-back service from 8 identities: 4 that open streams and send nothing, 4 that
  ask for dial-backs of 8 addresses each that nobody answers (its own IP's ports, and the
  newcomer's router's). `reachability_known_s`: from the newcomer's start until its log says
  how it is reachable (goal <= 10 s); `addresses_from_one_group`: the addresses it announces
  that are not relay ports (behind NAT nobody can dial it directly, so no two IP groups reached
  them: goal 0). Its baseline is another newcomer joining without the flood.
- `nat_sybil`: sybil_one_group (benchmarks/hostile_sybil.py) with its two victim peers relayed.

    python benchmarks/hostile_nat.py dialflood --initial-peers ... --out FILE   (the flooder)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from hostile_sybil import actor_process

from hexswarm.swarm.nat import netlab
from hexswarm.swarm.tools.launcher import LocalSwarm

ANY = "/ip4/0.0.0.0/tcp/0"
PUBLIC2_IP = "10.77.1.2"  # the second bootstrap: another /24 than netlab's public host
RELAY_IPS = (netlab.PUBLIC_HOST_IP, PUBLIC2_IP)
PEER_FLAGS = ("--host-maddrs", ANY, "--announce-period", "2")
HOLD_WANTED = 64  # relay_hold: connections the attacker tries to hold per relay port
HOLD_BURST = 16  # ... opened per port and half-second at most (closed ones are reopened)
FLOOD_IDENTITIES = 8  # dialback_flood: half silent, half asking
REACH_LINES = re.compile(
    r"reachability known ([\d.]+) s|reachable directly at .*\(([\d.]+) s after start\)"
    r"|(no node answered a dial-back)|(unreachable)"
)
GOAL_REACH_S = 10.0


@dataclass
class TwoPublicLab(netlab.NetLab):
    """netlab's networks plus a second public host, in a /24 of its own."""

    @property
    def public2_ns(self) -> str:
        return f"{self.prefix}-pub2"

    def build(self) -> None:
        super().build()
        self._add_ns(self.public2_ns)
        self._plug_into_internet(self.public2_ns, "p2", f"{PUBLIC2_IP}/16")


@contextlib.contextmanager
def nat_lab(bench, tag: str, homes: int = 3):
    """(net, local): the networks and two bootstraps, one in each public /24."""
    import torch

    torch.zeros(1).share_memory_()  # torch's shared-memory manager, before entering a namespace
    with (
        TwoPublicLab(homes=homes) as net,
        LocalSwarm(bench.workdir / f"{tag}-logs", env=bench.local.env) as local,
    ):
        first = local.start_bootstrap(
            60, launcher=net.exec_prefix(net.public_ns), host_maddrs=ANY,
            address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/",
        )  # fmt: skip
        local.start_bootstrap(
            60, "--initial-peers", first[0], name="bootstrap2", launcher=net.exec_prefix(net.public2_ns),
            host_maddrs=ANY, address_prefix=f"/ip4/{PUBLIC2_IP}/",
        )  # fmt: skip
        yield net, local


def home_peer(bench, net, local, home: int, name: str, wait: bool = True):
    """A peer of every block in home `home`, behind its NAT."""
    layers = f"0:{bench.spec.num_blocks}"
    launcher = net.exec_prefix(net.home(home).host_ns)
    return local.start_peer(bench.model, layers, name, *PEER_FLAGS, launcher=launcher, wait=wait, timeout=300)


def measure(bench, net, local, peers, honest_load, summarize, hop_cost, seconds: float | None = None) -> dict:
    """A fresh honest client in home 2: a warm-up, then the load; with the peers' records."""
    from hexswarm.client import DistributedModelForCausalLM
    from hexswarm.swarm.trust.records import read_peer_records

    with netlab.inside(net.home(2).host_ns):
        model = DistributedModelForCausalLM.from_pretrained(
            bench.model, initial_peers=local.initial_peers, coverage_timeout=60
        )
    try:
        with contextlib.suppress(Exception):  # the warm-up may fail like any request
            model.generate(bench.prompts[0], **bench.kwargs)
        marks = [len(p.log()) for p in peers]
        figures = summarize(honest_load(bench, model, seconds or bench.args.seconds))
        figures["hop_ms"] = hop_cost(peers, marks)
        names = {p.name for p in peers}
        figures["records"] = {
            r.name: {
                "reachability": r.reachability,
                "addrs": list(r.addrs),
                "observed_group": r.observed_group,
            }
            for r in read_peer_records(model.swarm.dht, bench.spec.model_id)
            if r.name in names
        }
    finally:
        model.shutdown()
    return figures


def ratio(baseline: dict, attack: dict) -> float | None:
    if attack.get("p99_ms") and baseline.get("p99_ms"):
        return round(attack["p99_ms"] / baseline["p99_ms"], 2)
    return None


def skipped() -> dict | None:
    why_not = netlab.available()
    return {"skipped": f"needs network namespaces: {why_not}"} if why_not else None


# --- relay_hold --------------------------------------------------------------------------------


class Holder(threading.Thread):
    """From inside namespace `ns`: up to HOLD_WANTED TCP connections to each target, reopened
    as they are closed, every other one silent and the rest after one byte (the first of a
    libp2p multistream header, so that the relay takes it for a client); counts how many of
    each stayed open at once and how long each lasted."""

    KINDS = ("silent", "one_byte")

    def __init__(self, ns: str, targets: list[tuple[str, int]]):
        super().__init__(name="relay-holder", daemon=True)
        self.ns, self.targets, self.stop = ns, targets, threading.Event()
        self.open: dict[tuple, list] = defaultdict(list)  # target -> [(socket, opened at, kind)]
        self.opened, self.failed, self.peak = 0, Counter(), Counter()
        self.lifetimes: defaultdict[str, list] = defaultdict(list)

    def run(self) -> None:
        with netlab.inside(self.ns):
            while not self.stop.is_set():
                for target in self.targets:
                    self._sweep(target)
                    for _ in range(min(HOLD_BURST, HOLD_WANTED - len(self.open[target]))):
                        try:
                            sock = socket.create_connection(target, timeout=2)
                        except OSError as e:
                            self.failed[type(e).__name__] += 1
                            break
                        kind = self.KINDS[self.opened % 2]
                        if kind == "one_byte":
                            sock.sendall(b"\x13")
                        sock.setblocking(False)  # the sweep peeks without waiting
                        self.opened += 1
                        self.open[target].append((sock, time.monotonic(), kind))
                time.sleep(0.5)
                for target in self.targets:
                    self._sweep(target)
                held = Counter(kind for entries in self.open.values() for _, _, kind in entries)
                for kind in (*self.KINDS, "all"):
                    self.peak[kind] = max(self.peak[kind], held.total() if kind == "all" else held[kind])
        for entries in self.open.values():
            for sock, _, _ in entries:
                sock.close()

    def _sweep(self, target) -> None:
        """Forgets the connections the other side closed (or reset)."""
        still = []
        for sock, opened, kind in self.open[target]:
            try:
                alive = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
            except BlockingIOError:
                alive = True
            except OSError:
                alive = False
            if alive:
                still.append((sock, opened, kind))
            else:
                self.lifetimes[kind].append(time.monotonic() - opened)
                sock.close()
        self.open[target] = still

    def figures(self) -> dict:
        def median(values: list) -> float | None:
            return round(sorted(values)[len(values) // 2], 1) if values else None

        return {
            "targets": [f"{ip}:{port}" for ip, port in self.targets],
            "wanted_per_target": HOLD_WANTED,
            "opened": self.opened,
            "held_at_once_max": dict(self.peak),
            "closed_by_relay": {k: len(v) for k, v in self.lifetimes.items()},
            "closed_after_s_median": {k: median(v) for k, v in self.lifetimes.items()},
            "connect_failed": dict(self.failed),
        }


def run_relay_hold(bench, honest_load, summarize, hop_cost) -> dict:
    if skip := skipped():
        return skip
    began = time.monotonic()
    with nat_lab(bench, "relay-hold") as (net, local):
        victim = home_peer(bench, net, local, 1, "v0")
        baseline = measure(bench, net, local, [victim], honest_load, summarize, hop_cost)
        addrs = baseline["records"].get("v0", {}).get("addrs", [])
        found = [re.match(r"/ip4/([\d.]+)/tcp/(\d+)/", a) for a in addrs]
        targets = [(m.group(1), int(m.group(2))) for m in found if m and m.group(1) in RELAY_IPS]
        holder = Holder(net.home(3).host_ns, targets)
        holder.start()
        try:
            time.sleep(3)  # the attacker holds all it can before the honest client dials
            attack = measure(bench, net, local, [victim], honest_load, summarize, hop_cost)
            attack["evidence"] = holder.figures()
        finally:
            holder.stop.set()
            holder.join(30)
    return {
        "baseline": baseline,
        "attack": attack,
        "p99_ratio": ratio(baseline, attack),
        "counts": {"connections_held": attack["evidence"]["held_at_once_max"].get("all", 0)},
        "phase_s": round(time.monotonic() - began, 1),
    }


# --- dialback_flood ------------------------------------------------------------------------------


def newcomer(bench, net, local, name: str, honest_load, summarize, hop_cost) -> dict:
    """A peer of every block joining from home 1: when its reachability was known, what it
    announces, and the honest load through it."""
    proc = home_peer(bench, net, local, 1, name, wait=False)
    began, seen_s = time.monotonic(), None
    deadline = began + 120
    while "online:" not in proc.log() and time.monotonic() < deadline and proc.alive():
        if seen_s is None and REACH_LINES.search(proc.log()):
            seen_s = round(time.monotonic() - began, 1)
        time.sleep(0.1)
    found = REACH_LINES.search(proc.log())
    logged = next((float(g) for g in (found.groups()[:2] if found else ()) if g), None)
    figures = {
        "reachability_known_s": logged if logged is not None else seen_s,
        "reachability_seen_s": seen_s,
    }
    figures["reachability_line"] = found.group(0)[:160] if found else None
    figures["unverified"] = "unverified" in proc.log()
    if "online:" not in proc.log():
        figures.update(online=False, requests=0, completed=0, exact=0, p99_ms=None)
        local.stop(proc)
        return figures
    figures.update(measure(bench, net, local, [proc], honest_load, summarize, hop_cost))
    addrs = figures["records"].get(name, {}).get("addrs", [])
    figures["addresses_from_one_group"] = sum(not any(f"/{ip}/" in a for ip in RELAY_IPS) for a in addrs)
    local.stop(proc)
    return figures


@contextlib.contextmanager
def dial_flooder(bench, net, local):
    out = bench.workdir / "actor-dialflood.json"
    args = [*net.exec_prefix(net.home(3).host_ns), sys.executable, __file__, "dialflood"]
    args += ["--initial-peers", *local.initial_peers, "--out", str(out)]
    args += ["--own-ip", net.home(3).host_ip, "--victim-ip", net.home(1).wan_ip]
    with actor_process(local, "actor-dialflood", args, out, timeout=120) as evidence:
        yield evidence


def run_dialback_flood(bench, honest_load, summarize, hop_cost) -> dict:
    if skip := skipped():
        return skip
    began = time.monotonic()
    with nat_lab(bench, "dialback") as (net, local):
        baseline = newcomer(bench, net, local, "calm", honest_load, summarize, hop_cost)
        with dial_flooder(bench, net, local) as evidence:
            time.sleep(3)  # the flood is in full swing when the newcomer starts
            attack = newcomer(bench, net, local, "flooded", honest_load, summarize, hop_cost)
        attack["evidence"] = evidence
    return {
        "baseline": baseline,
        "attack": attack,
        "p99_ratio": ratio(baseline, attack),
        "counts": {k: attack.get(k) for k in ("reachability_known_s", "addresses_from_one_group")},
        "count_goals": {"reachability_known_s": GOAL_REACH_S, "addresses_from_one_group": 0},
        "phase_s": round(time.monotonic() - began, 1),
    }


async def dial_flood(initial_peers: list[str], own_ip: str, victim_ip: str, stop: threading.Event) -> dict:
    """FLOOD_IDENTITIES identities against every bootstrap's dial-back service, as fast as it
    answers: half open streams and send nothing, half ask for addresses nobody answers."""
    import msgpack
    from hivemind.p2p import P2P, PeerID

    from hexswarm.swarm.nat.reachability.messages import DIALBACK_PROTOCOL, MAX_ADDRS
    from hexswarm.swarm.net.maddrs import peer_id_of
    from hexswarm.swarm.wire.frames import framed, read_payload

    helpers = [peer_id_of(a) for a in initial_peers]
    ports = range(40001, 40001 + MAX_ADDRS)
    addrs = [f"/ip4/{own_ip if i % 2 else victim_ip}/tcp/{p}" for i, p in enumerate(ports)]
    p2ps = [
        await P2P.create(initial_peers=initial_peers, host_maddrs=[], no_listen=True, nat_port_map=False)
        for _ in range(FLOOD_IDENTITIES)
    ]
    answers: defaultdict[str, Counter] = defaultdict(Counter)

    async def loop(p2p, helper: str, silent: bool) -> None:
        kind = "silent" if silent else "asking"
        while not stop.is_set():
            writer = None
            try:
                _, reader, writer = await asyncio.wait_for(
                    p2p.call_binary_stream_handler(PeerID.from_base58(helper), DIALBACK_PROTOCOL), 10
                )
                if not silent:
                    writer.write(framed(msgpack.packb({"addrs": addrs})))
                    await writer.drain()
                body = msgpack.unpackb(await asyncio.wait_for(read_payload(reader, 4096), 60))
                error = str(body.get("error", ""))
                answer = error.split(":")[0][:40] if error else f"reached {len(body.get('reached', []))}"
            except Exception as e:
                answer = type(e).__name__
            finally:
                if writer is not None:
                    writer.close()
            answers[kind][answer] += 1
            await asyncio.sleep(0.05)

    print("attacking", flush=True)
    tasks = [asyncio.ensure_future(loop(p, h, i % 2 == 0)) for i, p in enumerate(p2ps) for h in helpers]
    while not stop.is_set():
        await asyncio.sleep(0.2)
    for task in tasks:  # requests in flight are given up
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for p2p in p2ps:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(p2p.shutdown(), 10)
    return {
        "identities": FLOOD_IDENTITIES,
        "helpers": len(helpers),
        "asked_addrs": addrs,
        "answers": {k: dict(c) for k, c in answers.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="the dial-back flooder of dialback_flood")
    parser.add_argument("attack", choices=("dialflood",))
    parser.add_argument("--initial-peers", nargs="+", required=True)
    parser.add_argument("--own-ip", required=True, help="the flooder's host address in its home")
    parser.add_argument("--victim-ip", required=True, help="the newcomer's router's address")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    began = time.monotonic()

    evidence = asyncio.run(dial_flood(args.initial_peers, args.own_ip, args.victim_ip, stop))
    evidence["attack_s"] = round(time.monotonic() - began, 1)
    Path(args.out).write_text(json.dumps(evidence))


if __name__ == "__main__":
    main()
