"""The public swarm across real NATs: homes behind MASQUERADE routers in network namespaces.

Two bootstraps on the "internet" relay for peers at home; the client sits in a third home.
Nothing here is mocked: real p2pd daemons, real dial-backs, real TCP port relays on the
bootstraps (swarm/nat/port_relay.py; swarm/nat/netlab.py draws the topology). The tests run in file order on one lab and build on each other.
"""

from __future__ import annotations

import signal
import sys
import time
from functools import partial

import pytest
import torch

from hexswarm.swarm.nat import netlab
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import PeerState, read_peer_records
from tests.integration.conftest import SignalHopPeer, client_at_home, local_greedy

pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.slow]

WHY_NOT = netlab.available()
if WHY_NOT:
    pytest.skip(f"NAT tests need network namespaces: {WHY_NOT}", allow_module_level=True)

ANY = "/ip4/0.0.0.0/tcp/0"
PROMPT = [[1, 5, 9, 14, 3, 7]]
NEW_TOKENS = 12
# every peer announces the same speed, so that routes differ only by what the client measures
EQUAL_SPEED = ("--throughput", "50000", "--decode-ms", "0.3")
HOME_LINK_DELAY_MS = 2.0  # each way, on the links of homes 1 and 2


class Lab:
    def __init__(self, net: netlab.NetLab, local: LocalSwarm, model_dir):
        self.net, self.local, self.model_dir = net, local, model_dir
        self.peers = {}

    def start_peer(self, name: str, layers: str, ns: str, *extra: str, wait: bool = True):
        proc = self.local.start_peer(
            self.model_dir,
            layers,
            name,
            "--host-maddrs",
            ANY,
            "--announce-period",
            "2",
            *EQUAL_SPEED,
            *extra,
            wait=False,
            launcher=self.net.exec_prefix(ns),
        )
        self.peers[name] = proc
        if wait:
            self.local.wait_for_log(proc, "online:", 120)
        return proc

    def records(self, client) -> dict:
        return {r.name: r for r in read_peer_records(client.swarm.dht, client.spec.model_id)}


@pytest.fixture(scope="module")
def lab(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama")
    with netlab.NetLab(homes=3) as net, LocalSwarm(tmp_path_factory.mktemp("nat")) as local:
        public = net.exec_prefix(net.public_ns)
        for name in ("relay-a", "relay-b"):
            local.start_bootstrap(
                60,
                name=name,
                launcher=public,
                host_maddrs=ANY,
                address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/",
            )
        lab = Lab(net, local, model_dir)
        for home in (1, 2):  # a home's link is slower than the internet's, as at home: the router's
            net.delay_home(home, HOME_LINK_DELAY_MS)  # choice must not hang on sub-ms noise
        lab.start_peer("home1", "0:3", net.home(1).host_ns, wait=False)
        lab.start_peer("home2", "3:6", net.home(2).host_ns, wait=False)
        for proc in lab.peers.values():
            local.wait_for_log(proc, "online:", 120)
        yield lab


@pytest.fixture(scope="module")
def client(lab):
    with client_at_home(lab.net, lab.local, lab.model_dir, 3, coverage_timeout=60) as model:
        yield model


@pytest.fixture(scope="module")
def expected(lab):
    return local_greedy(lab.model_dir, PROMPT, NEW_TOKENS)


def generate(client, **kwargs):
    return client.generate(torch.tensor(PROMPT), max_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)


def test_peers_behind_nat_serve_through_relays_and_the_output_is_exact(lab, client, expected):
    records = lab.records(client)
    for name in ("home1", "home2"):
        record = records[name]
        assert record.state == PeerState.ONLINE and record.reachability == "relayed", record
        assert len(record.relays) == 2 and len(record.addrs) == 2, record
        assert all(a.startswith(f"/ip4/{netlab.PUBLIC_HOST_IP}/tcp/") for a in record.addrs), record
        assert (
            "behind NAT" in lab.peers[name].log()
            and "--host-maddrs /ip4/0.0.0.0/tcp/" in lab.peers[name].log()
        )
    assert torch.equal(generate(client), expected)
    assert client.last_route == "home1[0:3) -> home2[3:6)", client.last_route
    # home1 pushed every step to home2, through a relay's port between two homes
    assert client.last_hop_steps == {"sent": NEW_TOKENS, "pushed": NEW_TOKENS, "push_failed": 0}


async def _routing_table_of(boot_id: str, _dht, node) -> list[str] | None:
    """Runs in the client's DHT process: the peers a bootstrap's find names (its whole routing
    table, in a swarm this small: a find answers with up to 20 nodes); None if it did not answer."""
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID

    found = await node.protocol.call_find(PeerID.from_base58(boot_id), [DHTID.generate()])
    if found is None:
        return None
    return [p.to_base58() for _, nearest in found.values() for p in nearest.values()]


def test_peers_behind_nat_are_in_no_routing_table(lab, client):
    """They joined the DHT as clients (peer/dht_mode.py): a search never waits on them."""
    homes = {lab.records(client)[name].peer_id for name in ("home1", "home2")}
    for addr in lab.local.initial_peers:
        boot_id = addr.rsplit("/p2p/", 1)[1]
        named = client.swarm.dht.run_coroutine(partial(_routing_table_of, boot_id))
        assert named is not None and not homes & set(named), (boot_id, named)


def test_a_direct_peer_is_preferred_at_equal_speed(lab, client, expected):
    lab.start_peer("public", "0:3", lab.net.public_ns)
    deadline = time.monotonic() + 20
    while "public" not in lab.records(client) and time.monotonic() < deadline:
        time.sleep(0.5)
    record = lab.records(client)["public"]
    assert record.reachability == "direct" and record.addrs, record
    assert all(a.startswith(f"/ip4/{netlab.PUBLIC_HOST_IP}/tcp/") for a in record.addrs), record.addrs
    client.swarm.rtt_ms.clear()  # measure both candidates for blocks 0:3 afresh
    assert torch.equal(generate(client), expected)
    assert client.last_route.startswith("public[0:3)"), client.last_route


def test_a_peer_behind_nat_killed_mid_generation_fails_over_exactly(lab, client, expected):
    lab.start_peer("home1b", "3:6", lab.net.home(1).host_ns)
    kill = SignalHopPeer(client, lab.peers, tokens=4, hop=1)
    output = generate(client, stopping_criteria=[kill])
    assert kill.victim in ("home2", "home1b")
    assert torch.equal(output, expected)
    assert client.last_failovers, "the killed peer was failed over"


def test_a_relay_that_leaves_leaves_its_peers_served(lab, client, expected):
    relay_a = next(p for p in lab.local.processes if p.name == "relay-a")
    relay_a_id = lab.local.initial_peers[0].rsplit("/p2p/", 1)[1]
    lab.local.stop(relay_a, timeout=10)
    survivor = next(n for n in ("home2", "home1b") if lab.peers[n].alive())
    deadline = time.monotonic() + 45  # one re-check of the slots each announce period (2 s)
    record = None
    while time.monotonic() < deadline:
        record = lab.records(client).get(survivor) or record  # a read may miss it while the DHT heals
        if record and record.relays and relay_a_id not in record.relays:
            break
        time.sleep(1)
    assert record is not None, f"no record of {survivor} after relay-a left"
    assert record.state == PeerState.ONLINE and relay_a_id not in record.relays, record
    assert record.relays and all(relay_a_id not in a for a in record.addrs), record
    assert torch.equal(generate(client), expected)


def test_a_peer_no_relay_takes_stays_joining_and_says_why(lab, tmp_path):
    public = lab.net.exec_prefix(lab.net.public_ns)
    with LocalSwarm(tmp_path) as alone:
        [bootstrap] = alone.start_bootstrap(
            60,
            "--no-relay",
            launcher=public,
            host_maddrs=ANY,
            address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/",
        )
        launcher = lab.net.exec_prefix(lab.net.home(3).host_ns)
        peer = alone.start_peer(
            lab.model_dir, "0:6", "stranded", "--host-maddrs", ANY, wait=False, launcher=launcher
        )
        alone.wait_for_log(peer, "joining, not online", 90)
        assert "online:" not in peer.log()
        assert "no relay gave a working slot" in peer.log()
        status = alone.start_command(
            "status",
            [
                *public,
                sys.executable,
                "-m",
                "hexswarm.swarm.commands.cli",
                "status",
                "--initial-peers",
                bootstrap,
            ],
            ready="stranded",
            timeout=60,
        )
        assert "unreachable" in status.log(), status.log()
        assert peer.alive()
        alone.stop(peer, timeout=10)
        assert peer.popen.returncode in (0, -signal.SIGTERM)
