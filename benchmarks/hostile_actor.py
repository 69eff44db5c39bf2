"""The hostile volunteer of benchmarks/hostile.py: one attack, from a process and p2p identity of its own.

    python benchmarks/hostile_actor.py ATTACK --initial-peers ... --model M --targets h0 h1 --out FILE

It prints "attacking" once the attack is in force, keeps it up until SIGTERM, then writes what it
saw (one JSON object) to --out. Attacks:

- probe:    a correctly signed ONLINE record of its own whose addrs aim at a TCP listener it runs;
            it answers PING and refuses every OPEN (BUSY), as a full peer would. Counts TCP
            connections (should be 0) and the frames that reach it through p2p.
- hoard:    on every target, opens as many sessions of batch x max length as it is let, writes
            them full, keeps them alive with a step every few seconds and asks for more; counts
            refusals by code.
- slots:    on every target, opens as many streams as it is let (from --identities p2p
            identities) and PINGs on each every 2 s without opening a session, reopening each
            one the peer closes; how many it held, how long.
- hog:      one legitimate session after another on the first target, each a prefill of
            --max-length tokens, back to back; PING round trips to that peer meanwhile.
- sybil:    from --identities identities, --streams prefill loops as hog's on every target at
            once: one machine posing as many (run from one home of swarm/nat/netlab.py, so that
            every identity is in one IP group).
- flood:    10x the API's capacity in concurrent completion requests, and oversized bodies.
- stranger: its own client (push on) whose steps name a stranger's peer id as the next hop;
            counts what reaches the stranger (should be nothing) and whether outputs stay exact.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm.tools.launcher)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # the tests package (Outsider)

from ping_under_prefill import percentile, ping_while  # noqa: E402

from hexswarm.client.remote import PeerConnection, PeerError  # noqa: E402
from hexswarm.client.swarm_client import SwarmClient  # noqa: E402
from hexswarm.client.worker import run_sync  # noqa: E402
from hexswarm.swarm.models.model_spec import load_model_spec  # noqa: E402
from hexswarm.swarm.trust.records import PeerState, read_peer_records  # noqa: E402
from hexswarm.swarm.wire.frames import read_frame, write_frame  # noqa: E402
from hexswarm.swarm.wire.protocol import Error, ErrorCode, Ping, Pong  # noqa: E402
from tests.integration.test_peer_links import Outsider  # noqa: E402

KEEPALIVE_S = 5.0  # hoard: a step on every hoarded session this often (the idle timeout is 300 s)
FILL_HEADROOM = 32  # hoard: positions left free in each filled session for the keep-alive steps
PING_EVERY_S = 2.0  # slots: a PING on every held stream this often
HOG_PING_EVERY_S = 0.02
FLOOD_PAUSE_S = 0.5  # flood: a refused worker asks again after this (a tight loop would only burn CPU)
_ids = itertools.count()


def code_name(error: PeerError) -> str:
    return error.code.name if error.code is not None else "CLOSED"


def ms(values: list[float]) -> dict:
    """p50 / p99 / max of round trips in ms."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.5), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
    }


async def until(stop: threading.Event, seconds: float) -> bool:
    """Sleeps `seconds` or until `stop`; whether the attack goes on."""
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return not stop.is_set()


async def connect(swarm: SwarmClient, record, timeout: float = 30.0) -> PeerConnection:

    return await swarm.open_connection(record.peer_id, record.name, timeout)


# --- hoard: sessions that reserve the KV cache -------------------------------------------------


@dataclass
class Hoarded:
    """One session the hoarder holds."""

    conn: PeerConnection
    peer: str
    session: str
    batch: int
    max_length: int
    position: int = 0

    async def step(self, tokens: int, hidden_size: int) -> None:
        await self.conn.step(self.session, self.position, torch.randn(self.batch, tokens, hidden_size))
        self.position += tokens


async def hoard(swarms, targets, spec, args, stop: threading.Event) -> dict:
    length = args.max_length
    sizes = ((16, length), (4, length), (1, length), (1, length // 8))  # largest first
    held: list[Hoarded] = []
    refused, reserved, filled, steps = Counter(), Counter(), Counter(), Counter()
    conns = {r.name: await connect(swarms[0], r, timeout=300) for r in targets}

    async def open_while_let(record, batch: int, max_length: int, tries: int = 16) -> None:
        for _ in range(tries):
            session = f"hoard-{next(_ids)}"
            try:
                await conns[record.name].open(
                    session, spec.model_id, record.start, record.end, max_length, batch, torch.float32
                )
            except PeerError as e:
                refused[code_name(e)] += 1
                return
            held.append(Hoarded(conns[record.name], record.name, session, batch, max_length))
            reserved[record.name] += batch * max_length

    async def step(h: Hoarded, tokens: int) -> None:
        try:
            await h.step(tokens, spec.hidden_size)
            steps["ok"] += 1
        except PeerError as e:
            steps[code_name(e)] += 1

    for record in targets:
        for batch, max_length in sizes:
            await open_while_let(record, batch, max_length)
    for h in held:  # written full, so that the peer really holds the memory (KV grows with tokens)
        await step(h, h.max_length - FILL_HEADROOM)
        filled[h.peer] += h.batch * h.position
    first = {"sessions": len(held), "refused": dict(refused)}
    print("attacking", flush=True)
    while await until(stop, KEEPALIVE_S):
        for h in held:
            if h.position < h.max_length:
                await step(h, 1)
        for record in targets:  # honest sessions come and go: ask again for the space they free
            await open_while_let(record, 1, length, tries=1)
    for conn in conns.values():
        conn.close()
    return {"first_round": first, "sessions_held": len(held), "reserved_tokens": dict(reserved),
            "filled_tokens": dict(filled), "refused": dict(refused), "steps": dict(steps)}  # fmt: skip


# --- slots: streams that never open a session ---------------------------------------------------


async def open_stream(swarm, record) -> PeerConnection:
    """A stream with one PING answered on it (a refused stream answers an ERROR and is closed)."""
    conn = await connect(swarm, record, timeout=10)
    try:
        await conn.ping()
    except PeerError:
        conn.close()
        raise
    return conn


async def hold_streams(swarms, record, wanted: int, stop: threading.Event) -> dict:
    held: list[tuple[PeerConnection, float, list[float]]] = []  # (stream, opened at, [last pong at])
    refused, opened, peak = Counter(), 0, 0
    pongs_s, closed_s = [], []  # per stream the peer closed: last answered PING, and when we saw it closed
    while not stop.is_set():
        for entry in list(held):  # first the streams the peer closed since the last round ...
            conn, began, last = entry
            try:
                await conn.ping()
                last[0] = time.monotonic()
            except PeerError:
                pongs_s.append(last[0] - began)
                closed_s.append(time.monotonic() - began)
                held.remove(entry)
                conn.close()
        for swarm in swarms:  # ... then as many new ones as each identity is let
            while len(held) < wanted and not stop.is_set():
                try:
                    conn = await open_stream(swarm, record)
                except PeerError as e:  # over its share of the peer's stream slots: try again next round
                    refused[code_name(e)] += 1
                    break
                opened += 1
                held.append((conn, time.monotonic(), [time.monotonic()]))
        peak = max(peak, len(held))
        await until(stop, PING_EVERY_S)
    for conn, _, _ in held:
        conn.close()
    return {
        "opened": opened,
        "held_at_once_max": peak,
        "closed_by_peer": len(closed_s),
        "last_pong_s_max": round(max(pongs_s), 1) if pongs_s else None,
        "seen_closed_s_median": round(statistics.median(closed_s), 1) if closed_s else None,
        "refused": dict(refused),
    }


async def slots(swarms, targets, spec, args, stop: threading.Event) -> dict:
    print("attacking", flush=True)
    held = await asyncio.gather(*(hold_streams(swarms, r, args.streams, stop) for r in targets))
    from hexswarm.peer.admission import AdmissionLimits
    from hexswarm.peer.config import PeerConfig

    return {
        "identities": len(swarms),
        "streams_wanted_per_peer": args.streams,
        "peer_stream_slots": PeerConfig.__dataclass_fields__["max_streams"].default,
        "one_remote_may_hold": AdmissionLimits().streams_per_remote,
        "per_peer": dict(zip([r.name for r in targets], held, strict=True)),
    }


# --- hog: long prefills back to back ------------------------------------------------------------


async def prefill_loop(work, victim, spec, args, stop, prefill_s: list, refused: Counter) -> None:
    """One legitimate session after another on `victim` over `work`, each a prefill of
    --max-length tokens, until `stop`; a refused one waits half a second."""
    while not stop.is_set():
        session = f"hog-{next(_ids)}"
        began = time.perf_counter()
        try:
            await work.open(
                session, spec.model_id, victim.start, victim.end, args.max_length, 1, torch.float32
            )
            await work.step(session, 0, torch.randn(1, args.max_length, spec.hidden_size))
            await work.close_session(session)
        except (PeerError, OSError, asyncio.IncompleteReadError) as e:
            refused[code_name(e) if isinstance(e, PeerError) else type(e).__name__] += 1
            await until(stop, 0.5)
            continue
        prefill_s.append(time.perf_counter() - began)


async def sybil(swarms, targets, spec, args, stop: threading.Event) -> dict:
    """Every identity runs --streams prefill loops on every target at once (one machine posing
    as many: the peers' IP-group limits and fair shares are what stand in its way)."""
    prefill_s, refused, loops = [], Counter(), []
    for swarm, victim in itertools.product(swarms, targets):
        for _ in range(args.streams):
            try:
                work = await connect(swarm, victim, timeout=600)
            except Exception as e:  # a peer that will not take another stream from us
                refused[f"connect: {type(e).__name__}"] += 1
                continue
            loops.append((work, prefill_loop(work, victim, spec, args, stop, prefill_s, refused)))
    print("attacking", flush=True)
    await asyncio.gather(*(loop for _, loop in loops))
    for work, _ in loops:
        work.close()
    return {
        "identities": len(swarms),
        "loops": len(loops),
        "prefill_tokens": args.max_length,
        "prefills": len(prefill_s),
        "prefill_s_median": round(statistics.median(prefill_s), 3) if prefill_s else None,
        "refused": dict(refused),
    }


async def hog(swarms, targets, spec, args, stop: threading.Event) -> dict:
    swarm, victim = swarms[0], targets[0]
    pinger = await connect(swarm, victim)
    # The pinging stream owns a (1-token) session, so the handshake timeout does not close it.
    await pinger.open("hog-pinger", spec.model_id, victim.start, victim.start + 1, 1, 1, torch.float32)
    idle = [await pinger.ping() for _ in range(50)]
    work = await connect(swarm, victim, timeout=600)
    prefill_s, refused = [], Counter()
    print("attacking", flush=True)
    prefills = asyncio.ensure_future(prefill_loop(work, victim, spec, args, stop, prefill_s, refused))
    during = await ping_while(pinger, prefills, HOG_PING_EVERY_S)
    work.close()
    pinger.close()
    return {
        "victim": victim.name,
        "prefill_tokens": args.max_length,
        "prefills": len(prefill_s),
        "prefill_s_median": round(statistics.median(prefill_s), 3) if prefill_s else None,
        "refused": dict(refused),
        "ping_idle": ms(idle),
        "ping_during": ms(during),
    }


# --- flood: the OpenAI-style API ----------------------------------------------------------------


def flood(args, stop: threading.Event) -> dict:
    """10x the API's places from one client address (--source-ip: another address than the
    honest user's, as a flooder on the internet has)."""
    import http.client
    from urllib.parse import urlsplit

    statuses: Counter = Counter()
    workers = args.workers or 10 * args.api_capacity
    url = urlsplit(args.api)

    def post(body: dict) -> str:
        connection = http.client.HTTPConnection(
            url.hostname, url.port, timeout=120, source_address=(args.source_ip, 0)
        )
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {args.api_key}"}
        try:
            connection.request("POST", f"{url.path}/completions", json.dumps(body).encode(), headers)
            answer = connection.getresponse()
            answer.read()
            return str(answer.status)
        except OSError as e:  # a 413 may reset the connection while the body is still going out
            return type(e).__name__
        finally:
            connection.close()

    def worker(i: int) -> None:
        # one worker in --oversized-every sends bodies over the server's limit
        oversized = bool(args.oversized_every) and i % args.oversized_every == 0
        prompt = "x" * (2 * args.body_limit) if oversized else "A swarm of volunteers"
        while not stop.is_set():
            status = post({"model": args.served_name, "prompt": prompt, "max_tokens": 32, "ignore_eos": True})
            statuses[status] += 1
            if status != "200":
                stop.wait(FLOOD_PAUSE_S)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    print("attacking", flush=True)
    stop.wait()
    for t in threads:
        t.join(130)
    return {"workers": workers, "statuses": dict(statuses)}


# --- probe and stranger: a node outside the model's swarm ---------------------------------------


class RefusingOutsider(Outsider):
    """tests/integration/test_peer_links.py's outsider, answering every frame but PING with BUSY,
    as a full peer would: its record says ONLINE, so a client may try it (and must go elsewhere)."""

    async def _serve(self, info, reader, writer) -> None:
        self.streams += 1
        with contextlib.suppress(Exception):  # the other side closed the stream, or sent junk: done
            while True:
                message = await asyncio.wait_for(read_frame(reader, 1 << 20), 30)
                self.frames[type(message).__name__] += 1
                busy = Error(ErrorCode.BUSY, "full")
                await write_frame(writer, Pong(message.nonce) if isinstance(message, Ping) else busy)
        writer.close()


def outsider_figures(node: Outsider) -> dict:
    return {"tcp_connections": node.tcp_connections, "p2p_streams": node.streams, "frames": dict(node.frames)}


def probe(args, stop: threading.Event) -> dict:
    spec = load_model_spec(args.model)
    node = RefusingOutsider(args.initial_peers, Path(args.out).with_suffix(".key"))
    try:
        template = next(r for r in read_peer_records(node.dht, spec.model_id) if r.name == args.targets[0])
        aimed = f"/ip4/127.0.0.1/tcp/{node.tcp_port}/p2p/{node.peer_id}"  # its own listener, or any port
        node.announce(template, spec.model_id, state=PeerState.ONLINE, addrs=(aimed,))
        print("attacking", flush=True)
        while not stop.wait(20):
            node.announce(template, spec.model_id, state=PeerState.ONLINE, addrs=(aimed,))
        # Done: a clean exit's last word, so the next phase's clients do not meet a dead record.
        node.announce(template, spec.model_id, state=PeerState.GONE, addrs=(aimed,))
        return {"aimed_at": aimed, **outsider_figures(node)}
    finally:
        node.close()


def stranger(args, stop: threading.Event) -> dict:
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM, hop_links
    from hexswarm.swarm.wire.protocol import NextHop

    spec = load_model_spec(args.model)
    node = Outsider(args.initial_peers, Path(args.out).with_suffix(".key"))
    # Every step this client sends names the stranger as the next hop (with the real session ids).
    hop_links.NextHop = lambda peer_id, session: NextHop(node.peer_id, session)
    model = DistributedModelForCausalLM.from_pretrained(
        args.model, initial_peers=args.initial_peers, push=True
    )
    local = AutoModelForCausalLM.from_pretrained(spec.path)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    runs, exact, push_failed = 0, 0, 0
    try:
        print("attacking", flush=True)
        while not stop.is_set():
            prompt = torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(runs))
            got = model.generate(prompt, **kwargs)
            runs += 1
            exact += bool(torch.equal(got, local.generate(prompt, **kwargs)))
            push_failed += model.last_hop_steps.get("push_failed", 0)
            stop.wait(1.0)  # a slow client: the attack is the chain it names, not load
        return {"generations": runs, "exact": exact, "push_failed": push_failed, **outsider_figures(node)}
    finally:
        model.shutdown()
        node.close()


SWARM_ATTACKS = {
    "hoard": hoard,
    "slots": slots,
    "hog": hog,
    "sybil": sybil,
}  # async, over a SwarmClient of its own
OTHER_ATTACKS = {"probe": probe, "flood": flood, "stranger": stranger}


async def bare_identity(initial_peers: list[str]) -> SwarmClient:
    """A SwarmClient with a p2p identity of its own and no DHT node: a p2p daemon is all it takes
    to pose as another machine (and all one machine should spend on each of twenty)."""
    from hivemind.p2p import P2P

    p2p = await P2P.create(initial_peers=initial_peers, host_maddrs=[], no_listen=True, nat_port_map=False)
    return SwarmClient(dht=None, p2p=p2p)


def run_swarm_attack(args, stop: threading.Event) -> dict:
    spec = load_model_spec(args.model)
    swarms = [SwarmClient.connect(args.initial_peers)]
    for _ in range(args.identities - 1):
        swarms.append(run_sync(bare_identity(args.initial_peers), timeout=60))
    try:
        records = {r.name: r for r in read_peer_records(swarms[0].dht, spec.model_id)}
        targets = [records[name] for name in args.targets]
        for swarm in swarms:  # dialed at their records' addresses (relay circuits, namespaces)
            swarm.dialer.learn(list(records.values()))
        return run_sync(SWARM_ATTACKS[args.attack](swarms, targets, spec, args, stop))
    finally:
        for swarm in swarms:
            if swarm.dht is None:
                run_sync(swarm.p2p.shutdown(), timeout=10)
            else:
                swarm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attack", choices=[*SWARM_ATTACKS, *OTHER_ATTACKS])
    parser.add_argument("--initial-peers", nargs="+", required=True)
    parser.add_argument("--model", required=True, help="what the peers serve (a folder or a built-in name)")
    parser.add_argument("--targets", nargs="+", default=[], help="honest peers' names")
    parser.add_argument("--out", required=True, help="where to write the evidence (JSON)")
    parser.add_argument("--max-length", type=int, default=2048, help="hoard, hog: tokens per session")
    parser.add_argument(
        "--streams",
        type=int,
        default=64,
        help="slots: streams to try to hold per peer; sybil: prefill loops per identity and peer",
    )
    parser.add_argument("--identities", type=int, default=1, help="slots, sybil: p2p identities")
    parser.add_argument("--api", help="flood: the API's base URL (…/v1)")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--api-capacity", type=int, default=4, help="flood: running + queued places")
    parser.add_argument("--body-limit", type=int, default=1 << 20, help="flood: the API's body limit")
    parser.add_argument("--served-name", default="", help="flood: the API's model name")
    parser.add_argument(
        "--workers", type=int, default=0, help="flood: concurrent requests (0: 10x --api-capacity)"
    )
    parser.add_argument(
        "--oversized-every", type=int, default=10, help="flood: one worker in N sends too much (0: none)"
    )
    parser.add_argument("--source-ip", default="127.0.0.2", help="flood: the address it floods from")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    began = time.monotonic()
    if args.attack in SWARM_ATTACKS:
        evidence = run_swarm_attack(args, stop)
    else:
        evidence = OTHER_ATTACKS[args.attack](args, stop)
    evidence["attack_s"] = round(time.monotonic() - began, 1)
    Path(args.out).write_text(json.dumps(evidence))


if __name__ == "__main__":
    main()
