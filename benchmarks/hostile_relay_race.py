"""The `relay_race` phase of benchmarks/hostile.py: simultaneous relay-slot requests against a real
RelayService (swarm/nat/port_relay.py), while the honest load runs on the loopback swarm.

The relay runs in a thread of its own on 127.0.0.1: its slot and tunnel ports are real TCP
listeners, and each request arrives on a TCP connection of its own, handed to `handle_stream`
as a libp2p stream would be (a fresh peer id per connection). Its `group_of` awaits, as the
real one does (a query to the p2p daemon), so every request reaches the limit check while the
others are in flight. Each round sends REQUESTS at once, and holds every connection until all
have been answered (a granted slot lasts while its stream does):

- `per_group`: from one IP group, against max_slots_per_group = 8 (of 128 slots);
- `total`: each from an IP group of its own, against max_slots = 4.

`slots_over_limit` sums, over rounds, the slots granted beyond the limit (goal 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from collections import Counter

REQUESTS = 40
ROUND_EVERY_S = 2.0
REPLY_TIMEOUT_S = 10.0


class _Info:
    """What handle_stream reads of a libp2p stream: the remote's peer id."""

    def __init__(self, name: str):
        self.peer_id = type("PeerId", (), {"to_base58": lambda _self: name})()


async def race(limits, one_group: bool) -> Counter:
    """One round: REQUESTS slot requests at once; their answers ("granted", "refused", ...)."""
    from hexswarm.swarm.nat.port_relay import RelayService, _frame, _read_message

    names = itertools.count()

    async def group_of(peer_id: str) -> str:
        await asyncio.sleep(random.uniform(0, 0.005))  # the daemon round trip of ip_group_of
        return "10.77.13.0/24" if one_group else f"10.{int(peer_id[2:]) % 250}.0.0/24"

    relay = RelayService(host="127.0.0.1", limits=limits, group_of=group_of)
    await relay.start()
    server = await asyncio.start_server(
        lambda r, w: relay.handle_stream(_Info(f"Qm{next(names)}"), r, w), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    answers, held, all_in = Counter(), [], asyncio.Event()

    async def ask() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            held.append(writer)
            writer.write(_frame({"want": "slot"}))
            await writer.drain()
            reply = await _read_message(reader, REPLY_TIMEOUT_S)
            answers["granted" if "port" in reply else "refused"] += 1
        except Exception as e:
            answers[type(e).__name__] += 1
        if sum(answers.values()) == REQUESTS:
            all_in.set()
        await all_in.wait()

    try:
        await asyncio.wait_for(asyncio.gather(*(ask() for _ in range(REQUESTS))), 3 * REPLY_TIMEOUT_S)
    finally:
        for writer in held:
            writer.close()
        await asyncio.sleep(0.2)  # the relay sees every stream end and frees its slots
        server.close()
        relay.close()
    return answers


@contextlib.contextmanager
def relay_race(bench):
    """Rounds of both races in a thread, every ROUND_EVERY_S, while the honest load runs."""
    from hexswarm.swarm.nat.relay_limits import RelayLimits

    cases = {
        "per_group": (RelayLimits(max_slots=128, max_slots_per_group=8), True, 8),
        "total": (RelayLimits(max_slots=4, max_slots_per_group=8), False, 4),
    }
    stop, rounds = threading.Event(), []

    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            while not stop.is_set():
                for case, (limits, one_group, limit) in cases.items():
                    try:
                        answers = loop.run_until_complete(race(limits, one_group))
                    except Exception as e:  # counted, not fatal: the next round tries again
                        answers = Counter({f"round failed: {type(e).__name__}": 1})
                    rounds.append((case, limit, answers))
                stop.wait(ROUND_EVERY_S)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="relay-race", daemon=True)
    evidence: dict = {}
    began = time.monotonic()
    thread.start()
    try:
        yield evidence
    finally:
        stop.set()
        thread.join(60)
    over = sum(max(0, a["granted"] - limit) for _, limit, a in rounds)
    evidence.update(
        requests_per_round=REQUESTS,
        rounds=len(rounds),
        race_s=round(time.monotonic() - began, 1),
        granted_max={c: max((a["granted"] for k, _, a in rounds if k == c), default=None) for c in cases},
        limits={c: limit for c, (_, _, limit) in cases.items()},
        answers={c: dict(sum((a for k, _, a in rounds if k == c), Counter())) for c in cases},
        counts={"slots_over_limit": over},
        count_goals={"slots_over_limit": 0},
    )
