"""Which of a record's addresses a client dials, and how often (swarm/net/dialing.py; issue 49,
item 11): a record that points at a victim must not turn every client into its dialer."""

import asyncio

from hivemind.p2p import PeerID

from hexswarm.client.swarm_client import SwarmClient
from tests.unit.record_cases import make_record

LIAR = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


class _Daemon:
    """p2pd's client: counts the addresses it was asked to dial; every dial fails."""

    def __init__(self):
        self.dialed: list[str] = []

    async def connect(self, peer, maddrs):
        self.dialed += [str(m) for m in maddrs]
        raise ConnectionRefusedError("wrong peer id")


class _P2P:
    def __init__(self):
        self._client = _Daemon()


def _swarm(initial_peers=("/ip4/1.1.1.7/tcp/31337/p2p/QmBoot",)) -> SwarmClient:
    return SwarmClient(dht=None, p2p=_P2P(), initial_peers=initial_peers)


def test_a_lying_record_costs_each_client_a_few_dials_per_back_off_period():
    victim = [f"/ip4/1.2.3.{i}/tcp/80/p2p/{LIAR}" for i in range(1, 9)]
    liar = make_record(peer_id=LIAR, addrs=("/ip4/1.2.3.50/tcp/80", *victim))
    swarm = _swarm()
    swarm.dialer.learn([liar])
    for _ in range(5):  # every ping and stream open dials first
        asyncio.run(swarm.dialer.connect(PeerID.from_base58(LIAR)))
    dialed = swarm.p2p._client.dialed
    assert 0 < len(dialed) <= 4, dialed  # the first few addresses, once: then they back off
    assert "/ip4/1.2.3.50/tcp/80" not in dialed  # an address without the record's own id


def test_a_public_swarm_client_skips_private_addresses_from_records():
    private = ("/ip4/10.0.0.5/tcp/4242/p2p/" + LIAR, "/ip4/127.0.0.1/tcp/4242/p2p/" + LIAR)
    record = make_record(peer_id=LIAR, addrs=(*private, "/ip4/169.254.1.1/tcp/1/p2p/" + LIAR))
    swarm = _swarm()
    swarm.dialer.learn([record])
    asyncio.run(swarm.dialer.connect(PeerID.from_base58(LIAR)))
    assert swarm.p2p._client.dialed == []
    lab = _swarm(initial_peers=("/ip4/10.0.0.1/tcp/31337/p2p/QmBoot",))  # a swarm on its own network
    lab.dialer.learn([record])
    asyncio.run(lab.dialer.connect(PeerID.from_base58(LIAR)))
    assert "/ip4/10.0.0.5/tcp/4242" in lab.p2p._client.dialed


def test_a_failed_address_is_dialed_again_after_its_back_off_and_it_doubles():
    from hexswarm.swarm.net import dialing

    now = [0.0]
    swarm = _swarm()
    swarm.dialer.clock = lambda: now[0]
    swarm.dialer.learn([make_record(peer_id=LIAR, addrs=(f"/ip4/1.2.3.4/tcp/80/p2p/{LIAR}",))])
    peer = PeerID.from_base58(LIAR)
    dials = []
    for t in (0.0, 5.0, dialing.BACKOFF_S, dialing.BACKOFF_S + 5.0, 3 * dialing.BACKOFF_S):
        now[0] = t
        asyncio.run(swarm.dialer.connect(peer))
        dials.append(len(swarm.p2p._client.dialed))
    assert dials == [1, 1, 2, 2, 3]  # then 10 s, then 20 s of quiet
