"""The dial-back against strangers (issue 49, items 6 and 7): lying helpers cannot choose what a
peer announces, and the helper's service can be neither jammed nor turned into a port scanner.
The real DialBackService and Reachability, over fake p2p daemons (no network)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from hexswarm.peer import reachability as reach_mod
from hexswarm.swarm.nat.reachability import client as client_mod
from hexswarm.swarm.nat.reachability.messages import (
    BUSY,
    MAX_REQUEST_BYTES,
    DialBackReply,
    decode_reply,
    encode_reply,
    encode_request,
)
from hexswarm.swarm.nat.reachability.service import DialBackService
from hexswarm.swarm.wire.frames import framed, read_payload
from tests.unit.test_port_relay import FakePeerId

ASKER = "QmVkqaunyKCw4NKmWXbsGhkr5CotM8vCBKWyxsh8FGZyfr"
OTHER = "QmTTA2daxGqo5denp6SwLzzkLJm3fuisYEi9CoWsuHpzfb"
LISTEN = "/ip4/192.168.1.2/tcp/4000"
HONEST = "/ip4/198.51.100.7/tcp/4000"  # where the asker's router forwards its port
LIE = "/ip4/203.0.113.66/tcp/4000"


@dataclass
class Info:
    peer_id: FakePeerId
    addrs: list


class HelperP2P:
    """The helper's daemon: the asker connects from 198.51.100.7; another node is connected."""

    def __init__(self, asker_ip: str = "198.51.100.7"):
        self.asker_ip = asker_ip

    async def get_visible_maddrs(self):
        return ["/ip4/192.0.2.1/tcp/31337"]

    async def list_peers(self):
        return [
            Info(FakePeerId(ASKER), [f"/ip4/{self.asker_ip}/tcp/51000"]),
            Info(FakePeerId(OTHER), ["/ip4/198.18.0.5/tcp/4001"]),
        ]


class Writer:
    def __init__(self):
        self.data, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


async def reply_of(writer: Writer) -> DialBackReply:
    reader = asyncio.StreamReader()
    reader.feed_data(writer.data)
    reader.feed_eof()
    return decode_reply("QmH", await read_payload(reader, MAX_REQUEST_BYTES), [LISTEN, HONEST])


async def request(service: DialBackService, addrs: list[str], asker: str = ASKER) -> Writer:
    reader, writer = asyncio.StreamReader(), Writer()
    reader.feed_data(framed(encode_request(addrs)))
    await service.handle_stream(type("S", (), {"peer_id": FakePeerId(asker)})(), reader, writer)
    return writer


def recording(service: DialBackService) -> list:
    """Replaces the service's dialing with a recorder: nothing is dialed, every target is kept."""
    dialed = []

    async def dial(asker, targets):
        dialed.extend(targets)
        return []

    service._dial = dial
    return dialed


# --- item 7: the helper's service ------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_asker_that_sends_nothing_frees_its_slot_within_a_second():
    service = DialBackService(HelperP2P())
    recording(service)
    began = time.monotonic()
    reader, writer = asyncio.StreamReader(), Writer()  # a stream opened, and nothing sent on it
    await asyncio.wait_for(
        service.handle_stream(type("S", (), {"peer_id": FakePeerId(ASKER)})(), reader, writer), 3.0
    )
    assert time.monotonic() - began < 1.5
    assert service.busy.total() == 0


@pytest.mark.asyncio
async def test_one_ip_group_gets_a_bounded_number_of_dial_backs_a_minute():
    service = DialBackService(HelperP2P())
    recording(service)
    replies = [await reply_of(await request(service, [LISTEN])) for _ in range(60)]
    refused = [r for r in replies if r.error.startswith(BUSY)]
    assert 0 < len(replies) - len(refused) <= 30, len(refused)
    assert "per minute" in refused[-1].error
    # another IP group is not charged for it
    other = DialBackService(HelperP2P())
    other.rates = service.rates
    recording(other)
    other.p2p = HelperP2P(asker_ip="203.0.113.9")
    assert not (await reply_of(await request(other, [LISTEN]))).error


@pytest.mark.asyncio
async def test_a_helper_dials_nothing_outside_the_askers_own_ip():
    service = DialBackService(HelperP2P())
    dialed = recording(service)
    # a port of another node the helper is connected to: a port scanner's request
    await request(service, ["/ip4/198.18.0.5/tcp/22", "/ip4/192.0.2.1/tcp/25", LISTEN])
    assert dialed and all("/ip4/198.51.100.7/" in target[1] for target in dialed), dialed


class FakeProber:
    """A prober daemon: connects wherever it is told, and says where its connection is."""

    created = 0

    def __init__(self):
        FakeProber.created += 1
        self.connected: list[str] = []
        self._client = self

    async def connect(self, peer, maddrs):
        self.connected = [str(maddrs[0])]

    async def disconnect(self, peer):
        self.connected = []

    async def list_peers(self):
        return [Info(FakePeerId(ASKER), list(self.connected))] if self.connected else []

    async def shutdown(self):
        pass


@pytest.mark.asyncio
async def test_probes_reuse_a_pool_of_prober_daemons(monkeypatch):
    from hivemind import p2p as hivemind_p2p

    async def create(**kwargs):
        return FakeProber()

    monkeypatch.setattr(hivemind_p2p.P2P, "create", staticmethod(create))
    FakeProber.created = 0
    service = DialBackService(HelperP2P())
    for _ in range(5):
        reply = await reply_of(await request(service, [LISTEN]))
        assert reply.reached == ((LISTEN, HONEST),), reply
    assert FakeProber.created == 1  # five requests, one daemon: it was a fresh p2pd each before
    await service.close()


# --- item 7: the asker backs off on BUSY and asks another helper ------------------------------


class FakeDHT:
    def get_visible_maddrs(self):
        return [LISTEN]

    async def replicate_p2p(self):
        return AskerP2P()


class AskerP2P:
    """The asker's daemon: each helper connects from the IP its multiaddr names."""

    helpers: dict[str, str] = {}

    async def list_peers(self):
        return [Info(FakePeerId(h), [f"/ip4/{ip}/tcp/31337"]) for h, ip in self.helpers.items()]


def boot(name: str, ip: str) -> str:
    return f"/ip4/{ip}/tcp/31337/p2p/{name}"


async def run_reachability(
    monkeypatch, initial: list[str], answers: dict, records=(), serves=None, checks=None, restarts=None,
    joined_as_client=False,
):  # fmt: skip
    """Reachability.run in auto mode where helper `h` answers `answers[h]`; what was asked and the
    Reach. A peer that is not found direct stops at its relays' step (stood in for); `checks`,
    a list, gets the Reachability, and `restarts` the (client_mode, listen) of each restart."""
    asked: list[str] = []
    every = [*initial, *(a for r in records for a in r.addrs)]
    AskerP2P.helpers = {a.rsplit("/p2p/", 1)[1]: a.split("/")[2] for a in every}

    async def ask(p2p, helper, addrs, timeout=None):
        asked.append(helper)
        return answers.get(helper)

    async def no_relays(self, known):
        return reach_mod.Reach("unreachable", (), reason="relays stood in for", known_s=known)

    async def restart(client_mode=True, listen=()):
        if restarts is not None:
            restarts.append((client_mode, tuple(listen)))
        return FakeDHT()

    monkeypatch.setattr(client_mod, "ask", ask)
    monkeypatch.setattr(reach_mod.Reachability, "_first_slots", no_relays)
    check = reach_mod.Reachability(
        ASKER, "auto", time.monotonic(), restart, serves=serves, joined_as_client=joined_as_client
    )
    if checks is not None:
        checks.append(check)

    async def read_records():
        return list(records)

    _, reach = await check.run(FakeDHT(), initial, read_records)
    return asked, reach


def reached(helper: str, dialed: str, observed: str) -> DialBackReply:
    return DialBackReply(helper, ((LISTEN, dialed),), observed_ip=observed)


@pytest.mark.asyncio
async def test_helpers_that_say_busy_are_replaced_not_read_as_unverified(monkeypatch):
    initial = [boot("QmB1", "192.0.2.1"), boot("QmB2", "192.0.2.2"), boot("QmB3", "192.0.2.3")]
    initial.append(boot("QmB4", "192.0.2.4"))
    busy = DialBackReply("x", (), error=f"{BUSY}: 4 dial-backs running")
    answers = {"QmB1": busy, "QmB2": busy, "QmB3": busy, "QmB4": reached("QmB4", HONEST, "198.51.100.7")}
    asked, reach = await run_reachability(monkeypatch, initial, answers)
    assert "QmB4" in asked
    assert reach.mode == "direct" and reach.addrs == (f"{HONEST}/p2p/{ASKER}",), reach


@pytest.mark.asyncio
@pytest.mark.parametrize("joined_as_client", [True, False])
async def test_a_dht_client_restarts_as_a_server_only_when_found_direct(monkeypatch, joined_as_client):
    """peer/dht_mode.py: joined as a client, a direct peer's node restarts as a server on the
    ports it listened on, and one behind NAT keeps its node; joined as a server (before), one
    behind NAT restarts as a client."""
    initial = [boot("QmB1", "192.0.2.1"), boot("QmB2", "198.18.0.2")]
    direct = {h: reached(h, HONEST, "198.51.100.7") for h in ("QmB1", "QmB2")}
    natted = {h: DialBackReply(h, ()) for h in ("QmB1", "QmB2")}
    for answers, expected in ((direct, [(False, (LISTEN,))]), (natted, [])):
        restarts: list = []
        await run_reachability(
            monkeypatch, initial, answers, restarts=restarts, joined_as_client=joined_as_client
        )
        if not joined_as_client:  # the old order: a server first, a client once behind NAT
            expected = [] if answers is direct else [(True, ())]
        assert restarts == expected, (joined_as_client, restarts)


@pytest.mark.asyncio
async def test_a_peer_behind_nat_asks_its_chain_predecessors_for_relay_slots_first(monkeypatch):
    """It serves [4, 8): of the direct peers that answered, the one serving [0, 4) pushes steps to
    it, so it is asked first; the bootstrap comes after the direct peers, and a helper that did
    not answer its dial-back last."""
    from tests.unit.record_cases import make_record

    initial = [boot("QmBoot", "192.0.2.1")]
    ranges = {"QmOther": (8, 12), "QmBefore": (0, 4), "QmSilent": (2, 4)}
    direct = [
        make_record(peer_id=p, start=s, end=e, addrs=(boot(p, f"203.0.{k}.1"),))
        for k, (p, (s, e)) in enumerate(ranges.items(), start=10)
    ]
    answers = {h: DialBackReply(h, ()) for h in ("QmBoot", "QmOther", "QmBefore")}  # could not dial it
    monkeypatch.setattr(reach_mod, "direct_peers", lambda records: list(records))
    checks: list = []
    asked, _ = await run_reachability(
        monkeypatch, initial, answers, records=direct, serves=(4, 8), checks=checks
    )
    order = [c.peer_id for c in checks[0].relays]
    assert order[0] == "QmBefore" and order.index("QmOther") < order.index("QmBoot"), order
    helpers = [h.peer_id for h in checks[0].helpers]
    assert order[-1] == "QmSilent" if "QmSilent" in helpers else order[-1] == "QmBoot", (order, asked)
    assert reach_mod.predecessors(direct, (4, 8)) == {"QmBefore", "QmSilent"}
    assert reach_mod.predecessors(direct, (0, 4)) == set() == reach_mod.predecessors(direct, None)


# --- item 6: lying helpers cannot choose what a peer announces --------------------------------


@pytest.mark.asyncio
async def test_helpers_of_one_ip_group_cannot_put_an_address_in_the_record(monkeypatch):
    """The initial peers (two IP groups) do not answer; two Sybil helpers of one /24 say they
    reached the peer at an address of their choosing."""
    from tests.unit.record_cases import make_record

    initial = [boot("QmBootA", "192.0.2.1"), boot("QmBootB", "198.18.0.1")]
    sybils = [
        make_record(peer_id=f"QmSybil{i}", addrs=(boot(f"QmSybil{i}", f"203.0.113.{10 + i}"),))
        for i in (1, 2)
    ]
    answers = {f"QmSybil{i}": reached(f"QmSybil{i}", LIE, "203.0.113.66") for i in (1, 2)}
    monkeypatch.setattr(reach_mod, "direct_peers", lambda records: list(records))
    _, reach = await run_reachability(monkeypatch, initial, answers, records=sybils)
    assert all("203.0.113.66" not in a for a in reach.addrs), reach
    assert reach.mode != "direct", reach


@pytest.mark.asyncio
async def test_helpers_are_drawn_from_distinct_ip_groups(monkeypatch):
    initial = [
        boot("QmBoot", "192.0.2.1"),
        boot("QmSame1", "203.0.113.10"),
        boot("QmSame2", "203.0.113.11"),
        boot("QmElse", "198.18.0.1"),
    ]
    answers = {h: reached(h, HONEST, "198.51.100.7") for h in ("QmBoot", "QmSame1", "QmSame2", "QmElse")}
    asked, reach = await run_reachability(monkeypatch, initial, answers)
    assert asked[:3] == ["QmBoot", "QmSame1", "QmElse"], asked
    assert reach.mode == "direct" and reach.addrs == (f"{HONEST}/p2p/{ASKER}",), reach


def test_an_answer_naming_an_ip_the_asker_did_not_ask_about_is_ignored():
    asked = [LISTEN]
    # dialed at an IP that is neither the one asked about nor where the helper saw the asker
    lie = decode_reply("QmH", encode_reply([(LISTEN, LIE)], observed_ip="198.51.100.7"), asked)
    assert lie.reached == ()
    honest = decode_reply("QmH", encode_reply([(LISTEN, HONEST)], observed_ip="198.51.100.7"), asked)
    assert honest.reached == ((LISTEN, HONEST),)


class RememberingProber(FakeProber):
    """As libp2p does: `connect` dials what the peerstore remembers too, and the first address
    it ever reached wins the race."""

    def __init__(self):
        super().__init__()
        self.remembered: list[str] = []

    async def connect(self, peer, maddrs):
        self.remembered = self.remembered or [str(maddrs[0])]
        self.connected = [self.remembered[0]]


@pytest.mark.asyncio
async def test_a_probe_counts_only_at_the_address_asked_and_a_prober_is_not_reused_across_addresses():
    from hexswarm.swarm.nat.reachability.probers import ProberPool

    started: list[RememberingProber] = []

    async def start():
        started.append(RememberingProber())
        return started[-1]

    pool = ProberPool(start)
    assert await pool.probe(ASKER, HONEST, 1.0)
    assert await pool.probe(ASKER, HONEST, 1.0) and len(started) == 1  # the same address: reused
    assert await pool.probe(ASKER, LISTEN, 1.0) and len(started) == 2  # another: a fresh daemon
    # a daemon whose connection lands elsewhere than asked proves nothing
    pool.idle[0].reached.clear()
    pool.idle = pool.idle[:1]
    assert not await pool.probe(ASKER, "/ip4/198.51.100.7/tcp/4001", 1.0)
    await pool.close()
    assert not pool.idle
