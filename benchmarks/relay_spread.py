"""Where peers behind NAT take their relay slots, in a swarm of many direct peers.

`--joiners` peers behind NAT join a swarm of `--direct` direct peers and two bootstraps (the
initial peers), `--per-period` of them an announce period. Each runs the peer's own choice
(peer/reachability.py `Reachability.run`: the dial-back helpers it asks, the order it asks
relays in, `_ask_for_slots`' rule of at most one slot on a bootstrap) on the records of the
swarm as last announced: a direct peer's record states the slots its relay has free
(`relay_slots_free`), renewed once a period. Every helper answers "not reachable" and every
relay asked gives its slot unless it is full (128 slots, `RelayLimits`), so what is measured is
the choice alone, with no network: the slots each relay ends up holding.

Per run, one JSON line: `bootstrap_slots` (slots on the two bootstraps), `direct_slots_max` and
`direct_slots_p50` (over direct peers), `direct_relays_used`, `refused` (asks a full relay
refused). Runs the code it is started from: for a baseline, run it from an older checkout.

Run: python benchmarks/relay_spread.py --direct 200 --joiners 100 [--save]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save, stamp  # noqa: E402

MAX_SLOTS = 128
LISTEN = "/ip4/192.168.1.2/tcp/4000"


def peer_name(kind: str, i: int) -> str:
    return f"Qm{kind}{i:04d}"


def direct_record(i: int, free: int):
    """Direct peer `i`'s record, stating `free` slots where this checkout's records can."""
    from hexswarm.swarm.trust.records import PeerRecord, PeerState

    peer = peer_name("Direct", i)
    fields = dict(
        peer_id=peer, name=peer, model_id="m", start=0, end=4, state=PeerState.ONLINE, throughput=100.0,
        decode_ms_per_block=1.5, cache_tokens_left=1000, open_sessions=0, max_length=2048, dtype="float32",
        device="cpu", version="1", addrs=(f"/ip4/10.{i // 250}.{i % 250}.1/tcp/31337/p2p/{peer}",),
        reachability="direct",
    )  # fmt: skip
    if "relay_slots_free" in {f.name for f in dataclasses.fields(PeerRecord)}:
        fields["relay_slots_free"] = free
    return PeerRecord(**fields)


class FakeDHT:
    def get_visible_maddrs(self):
        return [LISTEN]

    async def replicate_p2p(self):
        return FakeP2P()


class FakeP2P:
    async def list_peers(self):
        return []


async def one_join(reach_mod, initial: list[str], records: list, slots: dict[str, int]) -> int:
    """One peer behind NAT chooses its relays on `records`; returns the asks refused (full)."""
    from hexswarm.swarm.nat.reachability.messages import DialBackReply

    chosen: list[str] = []

    async def take_slots(self, known):
        for _ in range(8):  # as `_first_slots` retries: a full relay is replaced by the next
            self._ask_for_slots()
            await asyncio.sleep(0)
            if len(chosen) >= reach_mod.WANT_RELAYS:
                break
        return reach_mod.Reach("unreachable", (), reason="stood in", known_s=known)

    refused = 0

    async def hold(self, relay):
        nonlocal refused
        if slots.get(relay.peer_id, 0) >= MAX_SLOTS:
            refused += 1
            self.failed_at[relay.peer_id] = time.monotonic()
            self.holders.pop(relay.peer_id, None)
            return
        slots[relay.peer_id] = slots.get(relay.peer_id, 0) + 1
        chosen.append(relay.peer_id)
        await asyncio.Event().wait()  # holds the slot

    async def ask(p2p, helper, addrs, timeout=None):
        return DialBackReply(helper, ())  # answered: could not dial it

    async def restart(client_mode=True, listen=()):
        return FakeDHT()

    async def read_records():
        return records

    with (
        mock.patch.object(reach_mod.Reachability, "_first_slots", take_slots),
        mock.patch.object(reach_mod.Reachability, "_hold", hold),
        mock.patch("hexswarm.swarm.nat.reachability.client.ask", ask),
        mock.patch.object(reach_mod, "helper_groups", mock.AsyncMock(return_value={})),
    ):
        check = reach_mod.Reachability("QmJoiner", "auto", time.monotonic(), restart)
        await check.run(FakeDHT(), initial, read_records)
        check.close()
    return refused


async def run(direct: int, joiners: int, per_period: int) -> dict:
    from hexswarm.peer import reachability as reach_mod

    initial = [f"/ip4/192.0.2.{k}/tcp/31337/p2p/{peer_name('Boot', k)}" for k in (1, 2)]
    slots: dict[str, int] = {}
    refused = 0
    for first in range(0, joiners, per_period):
        # the records as announced at the period's start: each direct peer's free slots then
        records = [direct_record(i, MAX_SLOTS - slots.get(peer_name("Direct", i), 0)) for i in range(direct)]
        for _ in range(first, min(first + per_period, joiners)):
            refused += await one_join(reach_mod, initial, records, slots)
    boots = [peer_name("Boot", k) for k in (1, 2)]
    on_direct = [slots.get(peer_name("Direct", i), 0) for i in range(direct)]
    return {
        "direct": direct,
        "joiners": joiners,
        "per_period": per_period,
        "bootstrap_slots": sum(slots.get(b, 0) for b in boots),
        "direct_slots_max": max(on_direct),
        "direct_slots_p50": statistics.median(on_direct),
        "direct_relays_used": sum(1 for n in on_direct if n),
        "refused": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--direct", type=int, default=200)
    parser.add_argument("--joiners", type=int, default=100)
    parser.add_argument("--per-period", type=int, default=20, help="peers behind NAT joining a period")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--save-as", default="relay_spread")
    args = parser.parse_args()
    logging.disable(logging.ERROR)  # each stood-in join says it is unreachable
    started = stamp()
    line = asyncio.run(run(args.direct, args.joiners, args.per_period))
    summary = {"bench": "relay_spread", "command": " ".join(sys.argv), **line, "started": started}
    print(json.dumps(summary), flush=True)
    if args.save:
        save(args.save_as, summary)


if __name__ == "__main__":
    main()
