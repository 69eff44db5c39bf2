"""Reachability's pure parts: what a helper may dial, how replies are read and judged, what a
peer announces, and the multiaddrs they are made of."""

from __future__ import annotations

import random
from collections import Counter

import msgpack
import pytest

from hexswarm.peer.reachability import (
    RELAY_WEIGHT_CAP,
    Candidate,
    by_free_slots,
    candidates,
    local_endpoint,
    nat_message,
    relay_order,
)
from hexswarm.swarm.nat.reachability.client import reachable_verdict
from hexswarm.swarm.nat.reachability.messages import (
    MAX_ADDRS,
    DialBackReply,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from hexswarm.swarm.nat.reachability.service import dial_targets
from hexswarm.swarm.nat.reachability.verdicts import agreed_addrs, chosen_first, reached_addrs
from hexswarm.swarm.net.dialing import dialable
from hexswarm.swarm.net.maddrs import ip_group, peer_id_of, tcp_addr, with_peer_id, without_peer_id
from tests.unit.record_cases import make_record

ME = "QmAsker"


def test_multiaddr_parts():
    assert tcp_addr("/ip4/10.0.0.1/tcp/31337") == tcp_addr("/ip4/10.0.0.1/tcp/31337/p2p/QmX")
    assert tcp_addr("/ip4/10.0.0.1/tcp/31337").port == 31337
    assert tcp_addr("/ip6/::1/tcp/5/p2p/QmX").ip == "::1"
    for bad in (
        "10.0.0.1:31337",
        "/ip4/10.0.0.1/udp/5",
        "/ip4/300.0.0.1/tcp/5",
        "/ip4/1.2.3.4/tcp/0",
        "/ip4/1.2.3.4/tcp/5/x/y/z",
    ):
        assert tcp_addr(bad) is None, bad
    assert peer_id_of("/ip4/1.2.3.4/tcp/5/p2p/QmX") == "QmX" and peer_id_of("/ip4/1.2.3.4/tcp/5") is None
    assert without_peer_id("/ip4/1.2.3.4/tcp/5/p2p/QmX") == "/ip4/1.2.3.4/tcp/5"
    assert with_peer_id("/ip4/1.2.3.4/tcp/5/p2p/QmX", "QmY") == "/ip4/1.2.3.4/tcp/5/p2p/QmY"
    assert ip_group("203.0.113.9") == ip_group("203.0.113.200") == "203.0.113.0/24"
    assert ip_group("2001:db8:1:2::5") == "2001:db8:1::/48"


def test_a_helper_dials_the_askers_own_ip_with_the_ports_it_names():
    targets = dial_targets(["/ip4/192.168.1.2/tcp/4000", "/ip4/127.0.0.1/tcp/4000"], {"203.0.113.9"})
    dialed = "/ip4/203.0.113.9/tcp/4000"
    assert targets == [("/ip4/192.168.1.2/tcp/4000", dialed, dialed)]  # one dial, not two


def test_a_helper_dials_its_own_relays_slot_for_the_asker_and_nothing_else():
    relay_port = "/ip4/198.51.100.7/tcp/5000/p2p/QmAsker"
    # this node's relay holds port 5000 for the asker: dialed where it listens, reported as asked
    assert dial_targets([relay_port], {"203.0.113.9"}, {5000: "127.0.0.1"}) == [
        (relay_port, "/ip4/127.0.0.1/tcp/5000", "/ip4/198.51.100.7/tcp/5000")
    ]
    # any other address, a node's included, is dialed only at the asker's own IP
    assert dial_targets(["/ip4/8.8.8.8/tcp/53"], {"203.0.113.9"}, {5000: "127.0.0.1"}) == [
        ("/ip4/8.8.8.8/tcp/53", "/ip4/203.0.113.9/tcp/53", "/ip4/203.0.113.9/tcp/53")
    ]
    assert dial_targets(["/ip4/8.8.8.8/tcp/53"], set()) == []
    many = [f"/ip4/10.0.0.1/tcp/{port}" for port in range(1000, 1100)]
    assert len(dial_targets(many, {"203.0.113.9"})) == MAX_ADDRS


def test_requests_and_replies_round_trip_and_reject_malformed_input():
    assert decode_request(encode_request(["/ip4/1.2.3.4/tcp/5"])) == ["/ip4/1.2.3.4/tcp/5"]
    for bad in (b"\xc1", msgpack.packb([1]), msgpack.packb({"addrs": "x"}), msgpack.packb({"addrs": [1]})):
        with pytest.raises(ValueError):
            decode_request(bad)
    with pytest.raises(ValueError):
        decode_request(msgpack.packb({"addrs": ["/ip4/1.2.3.4/tcp/5"] * (MAX_ADDRS + 1)}))
    asked = ["/ip4/192.168.1.2/tcp/4000"]
    reply = decode_reply("QmH", encode_reply([(asked[0], "/ip4/203.0.113.9/tcp/4000")], "203.0.113.9"), asked)
    assert reply.reached == ((asked[0], "/ip4/203.0.113.9/tcp/4000"),) and reply.observed_ip == "203.0.113.9"


def test_a_reply_counts_only_what_was_asked_at_the_port_asked():
    asked = ["/ip4/192.168.1.2/tcp/4000"]
    lies = [("/ip4/192.168.1.2/tcp/9999", "/ip4/1.1.1.1/tcp/9999"), (asked[0], "/ip4/1.1.1.1/tcp/4001")]
    assert decode_reply("QmH", encode_reply(lies), asked).reached == ()
    with pytest.raises(ValueError):
        decode_reply("QmH", msgpack.packb({"reached": [["only one"]]}), asked)


def reply(reached: bool, error: str = "") -> DialBackReply:
    return DialBackReply(
        "QmH", (("/ip4/1.2.3.4/tcp/5", "/ip4/1.2.3.4/tcp/5"),) if reached else (), error=error
    )


def test_the_verdict_needs_half_of_those_that_answered():
    assert reachable_verdict([None, None]) is None
    assert reachable_verdict([reply(False, error="busy")]) is None
    assert reachable_verdict([reply(True)]) is True
    assert reachable_verdict([reply(True), reply(False)]) is True
    assert reachable_verdict([reply(True), reply(False), reply(False)]) is False  # one liar is outvoted
    assert reachable_verdict([reply(False), None]) is False


def test_one_liar_chooses_neither_the_verdict_nor_the_address_announced():
    honest = ("/ip4/192.168.1.2/tcp/4000", "/ip4/198.51.100.7/tcp/4000")
    lie = ("/ip4/192.168.1.2/tcp/4000", "/ip4/203.0.113.66/tcp/4000")
    replies = [
        DialBackReply("QmBoot", (honest,)),
        DialBackReply("QmLiar", (lie,)),
        DialBackReply("QmB", (honest,)),
    ]
    assert reachable_verdict(replies) is True
    assert agreed_addrs(replies, ME) == ("/ip4/198.51.100.7/tcp/4000/p2p/QmAsker",)
    # a liar saying it reached us at two addresses still has one vote each; a busy helper none
    replies = [
        DialBackReply("QmLiar", (lie, lie)),
        DialBackReply("QmBoot", (honest,)),
        reply(False, error="busy"),
    ]
    assert set(agreed_addrs(replies, ME)) == {
        "/ip4/198.51.100.7/tcp/4000/p2p/QmAsker",
        "/ip4/203.0.113.66/tcp/4000/p2p/QmAsker",
    }  # one against one: as the verdict, a tie is not outvoted
    two_liars = [DialBackReply("QmL1", (lie,)), DialBackReply("QmL2", (lie,)), DialBackReply("QmBoot", ())]
    assert "/ip4/203.0.113.66/tcp/4000/p2p/QmAsker" in agreed_addrs(two_liars, ME)  # counted alike...
    # ... but a bootstrap the user named speaks for the swarm: Sybil helpers neither make a peer
    # behind NAT "direct" nor choose its address while one of the initial peers answers
    boot = ["/ip4/10.0.0.1/tcp/31337/p2p/QmBoot"]
    assert reachable_verdict(chosen_first(two_liars, boot)) is False
    two_liars_one_honest_boot = [*two_liars[:2], DialBackReply("QmBoot", (honest,))]
    assert agreed_addrs(chosen_first(two_liars_one_honest_boot, boot), ME) == (
        "/ip4/198.51.100.7/tcp/4000/p2p/QmAsker",
    )
    assert chosen_first(two_liars, []) == two_liars  # no initial peer answered: every answer counts


def test_a_peer_announces_what_helpers_reached_and_loopback_only_alone():
    both = DialBackReply(
        "QmH",
        (("a", "/ip4/127.0.0.1/tcp/5"), ("b", "/ip4/10.77.0.2/tcp/5"), ("c", "/ip4/10.77.0.2/tcp/5")),
    )
    assert reached_addrs([both, None], ME) == ("/ip4/10.77.0.2/tcp/5/p2p/QmAsker",)
    alone = DialBackReply("QmH", (("a", "/ip4/127.0.0.1/tcp/5"),))
    assert reached_addrs([alone], ME) == ("/ip4/127.0.0.1/tcp/5/p2p/QmAsker",)


def test_relay_candidates_are_initial_peers_then_direct_peers():
    direct = make_record(
        peer_id="QmDirect", addrs=("/ip4/10.0.0.9/tcp/7/p2p/QmDirect", "/ip4/10.0.0.9/tcp/8/p2p/QmOther")
    )
    found = candidates(["/ip4/10.0.0.1/tcp/1/p2p/QmBoot", "not an address", "/ip4/10.0.0.1/tcp/1"], [direct])
    assert found == [
        Candidate("QmBoot", "/ip4/10.0.0.1/tcp/1/p2p/QmBoot"),
        Candidate("QmDirect", "/ip4/10.0.0.9/tcp/7/p2p/QmDirect"),
    ]


def test_direct_peers_are_drawn_by_the_relay_slots_they_announce_free():
    """Newcomers behind NAT spread over direct peers in proportion to their free slots: a full
    relay comes last, a claim past the cap draws no more than an honest empty relay, and one
    that states nothing rarely comes first."""
    free = {"QmEmpty": RELAY_WEIGHT_CAP, "QmHalf": RELAY_WEIGHT_CAP // 2, "QmFull": 0, "QmOld": -1}
    free["QmLiar"] = 60_000
    records = [make_record(peer_id=p, relay_slots_free=n) for p, n in free.items()]
    rng = random.Random(7)
    orders = [[r.peer_id for r in by_free_slots(records, rng)] for _ in range(4000)]
    first = Counter(order[0] for order in orders)
    assert all(order[-1] == "QmFull" for order in orders)
    assert 0.8 < first["QmLiar"] / first["QmEmpty"] < 1.25, first
    assert 0.4 < first["QmHalf"] / first["QmEmpty"] < 0.6, first
    assert first["QmOld"] < 0.02 * len(orders) and first["QmFull"] == 0, first


def test_relays_are_direct_peers_first_then_bootstraps_and_silent_helpers_last():
    found = [
        Candidate(p, f"/ip4/10.0.0.{k}/tcp/1/p2p/{p}") for k, p in enumerate(["QmBoot", "QmA", "QmB", "QmC"])
    ]
    order = relay_order(found, silent={"QmA"}, upstream={"QmC"}, initial_peers=[found[0].addr])
    assert [c.peer_id for c in order] == ["QmC", "QmB", "QmBoot", "QmA"]


def test_a_tunnel_reaches_the_daemon_on_loopback_first():
    assert local_endpoint(["/ip4/192.168.1.2/tcp/4000/p2p/QmX", "/ip4/127.0.0.1/tcp/4000/p2p/QmX"]) == (
        "127.0.0.1",
        4000,
    )
    assert local_endpoint(["/ip4/192.168.1.2/tcp/4000"]) == ("192.168.1.2", 4000)
    assert local_endpoint([]) is None


def test_the_nat_line_names_the_relay_and_the_port_to_forward():
    line = nat_message(["/ip4/192.168.1.2/tcp/4242/p2p/QmX"], ["QmRelayAAAAAAAA"])
    assert "...AAAAAAAA" in line and "forward TCP port 4242" in line
    # a port the system chose for this start only: pin one first, or the forward breaks at the next
    line = nat_message(["/ip4/192.168.1.2/tcp/4242/p2p/QmX"], ["QmRelayAAAAAAAA"], pinned=False)
    assert "--host-maddrs /ip4/0.0.0.0/tcp/4242" in line and "forward that TCP port" in line


def test_a_record_is_dialed_only_at_its_own_tcp_addresses():
    addrs = (
        "/ip4/1.2.3.4/tcp/5/p2p/QmMe",
        "/ip4/1.2.3.4/tcp/6/p2p/QmSomeoneElse",
        "/dns/x/tcp/5",
        "/ip4/1.2.3.4/tcp/7",
    )
    # only those that carry its own id (issue 49: a record's addresses are its own word)
    assert dialable("QmMe", addrs) == ("/ip4/1.2.3.4/tcp/5/p2p/QmMe",)


def test_the_observed_group_is_what_most_helpers_saw():
    from hexswarm.peer.reachability import observed_group

    replies = [
        DialBackReply("QmBoot", (), observed_ip="198.51.100.7"),
        DialBackReply("QmB", (), observed_ip="198.51.100.9"),
        DialBackReply("QmLiar", (), observed_ip="not an ip"),
        None,
    ]
    assert observed_group(replies) == "198.51.100.0/24"
    assert observed_group([None]) == ""
