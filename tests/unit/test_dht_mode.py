"""peer/dht_mode.py: which peers join the DHT as clients, and the ports a server restarts on."""

from hexswarm.peer.dht_mode import joins_as_client, pinned_ports
from hexswarm.swarm.net.maddrs import is_loopback


def test_a_peer_that_may_be_behind_nat_joins_as_a_client():
    assert joins_as_client("auto", ["/ip4/0.0.0.0/tcp/0"])
    assert joins_as_client("relayed", ["/ip4/0.0.0.0/tcp/31337"])
    assert not joins_as_client("direct", ["/ip4/0.0.0.0/tcp/0"])
    assert not joins_as_client("auto", ["/ip4/127.0.0.1/tcp/0", "/ip6/::1/tcp/0"])  # this machine only
    assert joins_as_client("auto", ["/ip4/127.0.0.1/tcp/0", "/ip4/0.0.0.0/tcp/0"])


def test_a_server_restarts_on_the_ports_it_listened_on():
    listen = ["/ip4/10.0.0.5/tcp/41234", "/ip4/127.0.0.1/tcp/41234", "/ip6/::1/tcp/41999"]
    assert pinned_ports(["/ip4/0.0.0.0/tcp/0", "/ip6/::/tcp/0"], listen) == (
        "/ip4/0.0.0.0/tcp/41234",
        "/ip6/::/tcp/41999",
    )
    assert pinned_ports(["/ip4/0.0.0.0/tcp/5000"], listen) == ("/ip4/0.0.0.0/tcp/5000",)  # pinned already
    assert pinned_ports(["/ip4/0.0.0.0/tcp/0"], []) == ("/ip4/0.0.0.0/tcp/0",)


def test_loopback_addresses_are_told_apart_from_others():
    assert is_loopback("/ip4/127.0.0.1/tcp/0") and is_loopback("/ip6/::1/tcp/4000/p2p/QmX")
    assert is_loopback("/ip4/127.0.0.1/udp/4000/quic")  # a bootstrap lists its QUIC addresses too
    assert not is_loopback("/ip4/0.0.0.0/tcp/0") and not is_loopback("/ip4/10.0.0.1/tcp/1")
    assert not is_loopback("/dns/localhost/tcp/1") and not is_loopback("garbage")
