"""Whom a peer connects to, on a real swarm: only peers of its own model swarm, through p2p.

A swarm of its own (a bootstrap and two peers of a 6-block model, a [0:3) and b [3:6), announcing
every second), and outsiders: real hivemind nodes of this process, each with a session-protocol
handler that counts the streams and frames reaching it (it answers PING with PONG and refuses
pushes, as a peer would refuse an unknown session) and a TCP listener on 127.0.0.1 that counts
connections.

- A hostile outsider announces a correctly signed record whose `addrs` point at its TCP
  listener: the honest peers' round-trip probes must never connect there.
- A client names a stranger (no record) in a step's chain: the peer must not dial it, and the
  client still gets exact tokens by relaying that hop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from dataclasses import replace

import pytest
import torch

from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.net.dht import start_dht
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.tools.launcher import LOOPBACK, LocalSwarm
from hexswarm.swarm.trust.record_keys import record_key
from hexswarm.swarm.trust.records import PeerRecord, PeerState, link_tag, read_peer_records
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import SESSION_PROTOCOL, ErrorCode, Ping, Pong, PushAck, Step
from tests.integration.conftest import store_until_taken

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PERIOD_S = 1.0  # the peers' announce period: each one reads the records and probes then
NEW_TOKENS = 6
KWARGS = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


class Outsider:
    """A hivemind node outside the model's swarm, run on a loop of its own in this process."""

    def __init__(self, initial_peers: list[str], key_path):
        self.identity = load_or_create_identity(key_path)
        self.peer_id = self.identity.peer_id.to_base58()
        self.dht = start_dht(initial_peers, self.identity, host_maddrs=[LOOPBACK])
        self.streams, self.frames, self.tcp_connections = 0, Counter(), 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="outsider", daemon=True)
        self.thread.start()
        self._call(self._start())

    def _call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        self.p2p = await self.dht.replicate_p2p()
        await self.p2p.add_binary_stream_handler(SESSION_PROTOCOL, self._serve)
        self.tcp = await asyncio.start_server(self._count_tcp, "127.0.0.1", 0)
        self.tcp_port = self.tcp.sockets[0].getsockname()[1]

    async def _serve(self, info, reader, writer) -> None:
        self.streams += 1
        try:
            while True:
                message = await asyncio.wait_for(read_frame(reader, 1 << 20), 30)
                self.frames[type(message).__name__] += 1
                if isinstance(message, Ping):
                    await write_frame(writer, Pong(message.nonce))
                elif isinstance(message, Step):
                    await write_frame(writer, PushAck(message.session_id, ErrorCode.UNKNOWN_SESSION, "no"))
        except Exception:  # the other side closed the stream, or sent something else: done
            pass
        finally:
            writer.close()

    async def _count_tcp(self, reader, writer) -> None:
        self.tcp_connections += 1
        writer.close()

    def announce(self, template: PeerRecord, model_id: str, **changes) -> None:
        """Stores a record of its own (signed with its key, so readers accept it) for `model_id`."""
        record = replace(template, peer_id=self.peer_id, name="outsider", links=(), **changes)
        store_until_taken(
            self.dht,
            record_key(model_id, self.peer_id),
            record.to_bytes(),
            self.identity.owner_marker,
            lifetime=120,
        )

    async def _stop(self) -> None:
        self.tcp.close()
        await self.p2p.remove_binary_stream_handler(SESSION_PROTOCOL)
        await self.p2p.shutdown()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def close(self) -> None:
        try:
            self._call(self._stop(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():
                self.loop.close()
            shutdown_dht(self.dht, 5)


@pytest.fixture(scope="module")
def links_swarm(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama")
    with LocalSwarm(tmp_path_factory.mktemp("links")) as local:
        local.start_bootstrap()
        layout = {"a": ("0:3", ()), "b": ("3:6", ())}
        local.start_peers(model_dir, layout, "--announce-period", str(PERIOD_S), timeout=240)
        yield local, model_dir, load_model_spec(model_dir).model_id


@pytest.fixture
def outsider(links_swarm, tmp_path):
    made = []

    def make() -> Outsider:
        made.append(Outsider(links_swarm[0].initial_peers, tmp_path / f"outsider-{len(made)}.key"))
        return made[-1]

    yield make
    for node in made:
        node.close()


def honest_records(node: Outsider, model_id: str) -> dict[str, PeerRecord]:
    return {r.name: r for r in read_peer_records(node.dht, model_id) if r.name in ("a", "b")}


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.25)


def test_probes_go_to_peer_ids_through_p2p_and_never_to_an_announced_address(links_swarm, outsider):
    _, _, model_id = links_swarm
    hostile = outsider()
    template = honest_records(hostile, model_id)["a"]
    aimed = f"/ip4/127.0.0.1/tcp/{hostile.tcp_port}/p2p/{hostile.peer_id}"  # its own listener, or any port
    hostile.announce(template, model_id, state=PeerState.JOINING, addrs=(aimed,))
    assert hostile.peer_id in {r.peer_id for r in read_peer_records(hostile.dht, model_id)}

    def measured_each_other() -> bool:
        records = honest_records(hostile, model_id)
        if set(records) != {"a", "b"}:
            return False
        a, b = records["a"], records["b"]
        return link_tag(b.peer_id) in dict(a.links) and link_tag(a.peer_id) in dict(b.links)

    wait_for(measured_each_other, 30, "a and b publish round trips to each other")
    # the peers read the hostile record and probe it, round after round: at its peer id, through
    # p2p, as PINGs (each peer probes it once a round: 6 PINGs are about 3 rounds of both)
    wait_for(lambda: hostile.frames["Ping"] >= 6, 60, "the honest peers probe the hostile peer for 3 rounds")
    assert hostile.tcp_connections == 0
    records = honest_records(hostile, model_id)
    for name, other in (("a", "b"), ("b", "a")):
        rtt = dict(records[name].links)[link_tag(records[other].peer_id)]
        assert 0 < rtt < 5000, (name, rtt)
        print(f"{name} -> {other}: {rtt:.2f} ms (PING over a p2p stream, smoothed)")
    # The honest peers probed the hostile peer too: at its peer id, through p2p, as PINGs.
    assert hostile.frames["Ping"] > 0 and set(hostile.frames) == {"Ping"}, hostile.frames


@pytest.fixture
def push_client(links_swarm):
    from hexswarm.client import DistributedModelForCausalLM

    model = DistributedModelForCausalLM.from_pretrained(
        links_swarm[1], initial_peers=links_swarm[0].initial_peers, push=True
    )
    yield model
    model.shutdown()


def test_a_chain_naming_a_peer_outside_the_swarm_is_never_dialed_and_is_relayed(
    links_swarm, outsider, push_client, monkeypatch, caplog
):
    from transformers import AutoModelForCausalLM

    from hexswarm.client import hop_links
    from hexswarm.swarm.wire.protocol import NextHop

    _, model_dir, model_id = links_swarm
    stranger = outsider()
    # The client names the stranger as the next hop of every chain (its peers' own session ids).
    monkeypatch.setattr(hop_links, "NextHop", lambda peer_id, session: NextHop(stranger.peer_id, session))
    prompt = torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(7))
    expected = AutoModelForCausalLM.from_pretrained(model_dir).generate(prompt, **KWARGS)

    with caplog.at_level(logging.INFO, logger="hexswarm.client.session"):
        got = push_client.generate(prompt, **KWARGS)
    assert torch.equal(got, expected) and push_client.last_route.startswith("a[0:3) -> b[3:6)")
    # then the client relays that hop; its one retry (at the 5th of 6 steps) is refused too
    assert push_client.last_hop_steps["push_failed"] == 2
    assert "does not announce this model in the DHT: not dialed" in caplog.text
    assert stranger.streams == 0 and not stranger.frames

    # Control: once the stranger announces the model, a's pushes do reach it (and it refuses them).
    stranger.announce(honest_records(stranger, model_id)["a"], model_id, state=PeerState.JOINING)

    def pushed_to_the_stranger() -> bool:  # once a's read of the records has the stranger's
        assert torch.equal(push_client.generate(prompt, **KWARGS), expected)
        return stranger.frames["Step"] >= 1

    wait_for(pushed_to_the_stranger, 30, "a pushes to the stranger once it announces the model")


def test_a_pushing_client_prices_its_chain_by_the_link_its_peers_measured(links_swarm, push_client):
    from hexswarm.routing.chains.min_latency import min_latency_route
    from hexswarm.routing.chains.peer_links import pair
    from hexswarm.routing.chains.swarm_view import RouteRequest

    _, _, model_id = links_swarm
    spec, swarm = push_client.spec, push_client.swarm

    def both_reported() -> bool:
        records = {r.name: r for r in read_peer_records(swarm.dht, model_id)}
        return {"a", "b"} <= set(records) and link_tag(records["b"].peer_id) in dict(records["a"].links)

    wait_for(both_reported, 30, "a publishes its round trip to b, its chain neighbour")
    records = [r for r in read_peer_records(swarm.dht, model_id) if r.name in ("a", "b")]
    a, b = sorted(records, key=lambda r: r.name)
    pushed = swarm.view(records, spec.num_blocks, spec.hidden_size, peer_links=True)
    assert not swarm.view(records, spec.num_blocks, spec.hidden_size).peer_rtt_ms  # a relaying client's
    relayed = replace(pushed, peer_rtt_ms={})  # the same round trips, priced as if relayed
    reports = [ms for r, other in ((a, b), (b, a)) for tag, ms in r.links if tag == link_tag(other.peer_id)]
    assert pushed.peer_rtt_ms == {pair(a.peer_id, b.peer_id): max(reports)}
    request = RouteRequest(prompt_tokens=8, new_tokens=8)
    with_links, without = min_latency_route(pushed, request), min_latency_route(relayed, request)
    assert [h.peer_id for h in with_links.hops] == [a.peer_id, b.peer_id]
    rtt = pushed.client_rtt_ms
    link = max(max(reports), abs(rtt[a.peer_id] - rtt[b.peer_id]))
    # the hop from a to b is priced as the link's one-way trip, not as the client relaying it
    assert with_links.latency_ms - without.latency_ms == pytest.approx(
        (link - rtt[a.peer_id] - rtt[b.peer_id]) / 2, abs=1e-6
    )
