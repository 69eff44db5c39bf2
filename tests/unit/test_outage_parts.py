"""The pieces that tell a user the truth when parts of a swarm are gone (plain data, no processes):
contacts to re-join the DHT through, a dead span's error, verification that compared too little,
and the API's report of what was compared."""

import pytest

from hexswarm.client.api.answer_report import final_extension, with_extension
from hexswarm.client.api.text import Finished
from hexswarm.client.retry import Attempt, BanList, RetryPolicy, SpanUnservedError
from hexswarm.client.verify_records import NotComparedError, SpanTally, short_spans
from hexswarm.swarm.net.rejoin import MAX_CONTACTS, contacts_from

A = "QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q"
B = "QmRUmUq1Q6tqom4PauGazikHfwxK8ttnPb6Z57ae8V28xK"


def test_contacts_are_the_initial_peers_first_then_others_never_itself_and_bounded():
    initial = [f"/ip4/10.0.0.1/tcp/31337/p2p/{A}", f"/ip4/10.0.0.2/tcp/31337/p2p/{A}"]
    others = [(B, [f"/ip4/10.0.0.3/tcp/4000/p2p/{B}", "/dns/x.example/tcp/1"]), (A, ["/ip4/10.0.0.9/tcp/1"])]
    contacts = contacts_from(initial, others, own_id="")
    assert [c.peer_id for c in contacts] == [A, B]
    assert contacts[0].addrs == tuple(initial) and contacts[1].addrs == (f"/ip4/10.0.0.3/tcp/4000/p2p/{B}",)
    assert [c.peer_id for c in contacts_from(initial, others, own_id=A)] == [B]
    many = [(f"Qm{i:044d}", [f"/ip4/10.1.0.{i}/tcp/1"]) for i in range(20)]
    assert len(contacts_from([], many, own_id="")) == MAX_CONTACTS


def test_a_dead_span_names_its_blocks_and_the_peer_that_failed_there():
    attempts = [
        Attempt("bob", 15, 30, "UNREACHABLE: connection reset"),
        Attempt("(none)", 15, 30, "no route"),
    ]
    error = SpanUnservedError(attempts, "smollm2", 15, 30, 3.04)
    assert str(error).startswith("no peer serves blocks 15:30 of smollm2 now (the last peer that served")
    assert "bob, failed: UNREACHABLE: connection reset" in str(error) and "waited 3.0 s" in str(error)
    assert error.start == 15 and error.end == 30 and error.attempts == attempts
    with pytest.raises(ValueError):
        RetryPolicy(replacement_wait_s=-1)


def test_a_lifted_ban_ends_at_once_and_the_next_grows_as_before():
    now = [0.0]
    bans = BanList(RetryPolicy(ban_base_s=10, ban_factor=2), clock=lambda: now[0])
    bans.ban("p")
    bans.lift("p")
    assert bans.banned() == frozenset()
    assert bans.ban("p") == 20  # its failures still count


def test_spans_short_of_comparisons_by_default_none_compared_else_a_share():
    tally = {(0, 15): SpanTally(steps=10, compared=10), (15, 30): SpanTally(steps=10, compared=0)}
    assert set(short_spans(tally, None)) == {(15, 30)}
    tally[(15, 30)].compared = 3
    assert short_spans(tally, None) == {} and set(short_spans(tally, 0.5)) == {(15, 30)}
    assert short_spans(tally, 0.0) == {}
    error = NotComparedError(short_spans(tally, 0.5), 0.5, "7 no other peer serves the blocks in that format")
    assert "blocks 15:30 (3 of 10 steps compared)" in str(error) and "--verify-min-compared 0" in str(error)


def test_the_api_reports_what_was_compared_in_its_own_field_only_when_verifying():
    summary = {"steps": 4, "compared": 0, "unchecked_spans": ["0:2"], "spans": []}
    assert with_extension({"id": "x"}, final_extension(Finished("stop", 4, summary), None)) == {
        "id": "x",
        "hexswarm": {"verification": summary},
    }
    assert with_extension({"id": "x"}, final_extension(Finished("stop", 4), None)) == {"id": "x"}


@pytest.mark.parametrize(
    "unstored, answered, announced", [(True, ["Qb"], 1), (True, [], 0), (False, ["Qb"], 0)]
)
def test_an_announcement_that_reached_no_node_is_made_again_once_a_contact_answers(
    monkeypatch, unstored, answered, announced
):
    import asyncio

    from hexswarm.peer import joining

    asked = []

    async def ping_missing(dht, contacts, everyone=False):
        asked.append(everyone)
        return [c.peer_id for c in contacts], answered

    monkeypatch.setattr(joining, "ping_missing", ping_missing)
    calls = []

    async def reannounce():
        calls.append(1)

    rejoin = joining.Rejoin("Qa", ("/ip4/10.0.0.1/tcp/1/p2p/Qb",), reannounce=reannounce)
    asyncio.run(rejoin.step(None, [], unstored=unstored))
    assert len(calls) == announced
    assert asked == [True]  # every contact is pinged: own record unread, or the store reached none
