"""The API's admission control: bounded places, run slots in arrival order, 429 and 503 with Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from hexswarm.client.api.admission import MAX_RETRY_AFTER_S, Admission, AdmissionLimits
from hexswarm.client.api.schema import ApiError


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=10))


async def settle() -> None:
    for _ in range(5):  # let woken tasks run
        await asyncio.sleep(0)


def test_past_running_plus_queued_places_a_request_gets_429_with_retry_after_at_once():
    admission = Admission(AdmissionLimits(max_running=2, max_queued=1))
    tickets = [admission.admit() for _ in range(3)]
    with pytest.raises(ApiError) as refused:
        admission.admit()
    assert refused.value.status == 429 and refused.value.code == "queue_full"
    assert refused.value.headers == {"Retry-After": "1"}  # nothing measured yet: the floor
    tickets[0].done()
    admission.admit()  # a place came free


def test_slots_go_to_queued_requests_in_arrival_order():
    async def scenario():
        admission = Admission(AdmissionLimits(max_running=1, max_queued=3))
        first = admission.admit()
        await first.wait_turn()
        order = []

        async def queued(name: str):
            ticket = admission.admit()
            await ticket.wait_turn()
            order.append(name)
            return ticket

        tasks = [asyncio.create_task(queued(n)) for n in "abc"]
        await settle()
        assert (admission.running, admission.queued) == (1, 3)
        first.done()
        for task in tasks:
            (await task).done()
        assert order == ["a", "b", "c"]
        assert (admission.running, admission.places) == (0, 0)

    run(scenario())


async def two_queued_behind_one_running():
    """(admission, running ticket, two queued tickets, their waiting tasks)."""
    admission = Admission(AdmissionLimits(max_running=1, max_queued=2))
    holder = admission.admit()
    await holder.wait_turn()
    queued = [admission.admit(), admission.admit()]
    waits = [asyncio.create_task(ticket.wait_turn()) for ticket in queued]
    await settle()
    return admission, holder, queued, waits


def test_a_request_cancelled_while_queued_gives_its_place_back_and_never_runs():
    async def scenario():
        admission, holder, (leaver, stayer), (leaving, staying) = await two_queued_behind_one_running()
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        leaver.done()
        assert admission.queued == 1 and not leaver.has_slot
        holder.done()
        await staying
        assert stayer.has_slot and admission.running == 1

    run(scenario())


def test_a_slot_handed_over_as_its_waiter_is_cancelled_passes_on():
    async def scenario():
        admission, holder, (late, next_one), (late_wait, next_wait) = await two_queued_behind_one_running()
        holder.done()  # hands the slot to `late`, whose task has not resumed yet...
        late_wait.cancel()  # ...and is cancelled before it does
        with pytest.raises(asyncio.CancelledError):
            await late_wait
        late.done()
        await next_wait
        assert next_one.has_slot and admission.running == 1 and admission.places == 1

    run(scenario())


def test_a_request_queued_past_the_timeout_gets_503_with_retry_after():
    async def scenario():
        admission = Admission(AdmissionLimits(max_running=1, max_queued=1, queue_timeout_s=0.05))
        holder = admission.admit()
        await holder.wait_turn()
        waiting = admission.admit()
        with pytest.raises(ApiError) as refused:
            await waiting.wait_turn()
        waiting.done()
        assert refused.value.status == 503 and refused.value.code == "queue_timeout"
        assert "Retry-After" in refused.value.headers
        assert admission.places == 1 and not admission._waiters

    run(scenario())


def test_retry_after_follows_how_long_slots_are_held(monkeypatch):
    import hexswarm.client.api.admission as module

    async def scenario():
        admission = Admission(AdmissionLimits(max_running=2, max_queued=0))
        clock = [100.0]
        monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
        for _ in range(40):  # slots held 30 s each: one of the two frees every ~15 s
            ticket = admission.admit()
            await ticket.wait_turn()
            clock[0] += 30.0
            ticket.done()
        assert admission.retry_after_s() == 15
        admission.mean_hold_s = 10_000.0
        assert admission.retry_after_s() == MAX_RETRY_AFTER_S

    run(scenario())


@pytest.mark.parametrize("limits", [dict(max_running=0), dict(max_queued=-1), dict(queue_timeout_s=0)])
def test_limits_out_of_range_are_refused(limits):
    with pytest.raises(ValueError):
        AdmissionLimits(**limits)


def test_run_slots_go_round_robin_over_clients_so_a_flood_waits_behind_itself():
    async def scenario():
        admission = Admission(AdmissionLimits(max_running=1, max_queued=15))  # 4 places a client
        first = admission.admit("flooder")
        await first.wait_turn()
        order = []

        async def queued(client: str, name: str):
            ticket = admission.admit(client)
            await ticket.wait_turn()
            order.append(name)
            ticket.done()

        tasks = [asyncio.create_task(queued("flooder", f"f{i}")) for i in range(3)]
        await settle()
        tasks.append(asyncio.create_task(queued("honest", "h")))  # arrives last
        await settle()
        first.done()
        await asyncio.gather(*tasks)
        assert order == ["f0", "h", "f1", "f2"]  # the honest request waits one turn, not three

    run(scenario())


def test_one_client_holds_at_most_a_quarter_of_the_places():
    admission = Admission(AdmissionLimits(max_running=2, max_queued=10))  # 12 places, 3 a client
    for _ in range(3):
        admission.admit("flooder")
    with pytest.raises(ApiError) as refused:
        admission.admit("flooder")
    assert refused.value.status == 429 and refused.value.code == "client_queue_full"
    assert "Retry-After" in refused.value.headers
    admission.admit("honest")  # another client still gets a place


def test_one_slot_in_eight_is_kept_for_a_client_running_nothing():
    async def scenario():
        admission = Admission(AdmissionLimits(max_running=8, max_queued=64))
        flood = [admission.admit("flooder") for _ in range(9)]
        waits = [asyncio.create_task(t.wait_turn()) for t in flood]
        await settle()
        assert sum(t.has_slot for t in flood) == 7 and admission.running == 7  # one slot kept
        honest = admission.admit("honest")
        await asyncio.wait_for(honest.wait_turn(), 1)  # at once, not after a flood generation
        assert admission.running == 8
        honest.done()  # its slot goes back to the pool, not to the flooder at its cap
        await settle()
        assert admission.running == 7 and sum(t.has_slot for t in flood) == 7
        flood[0].done()  # one of the flooder's own slots frees: its queued request takes it
        await settle()
        assert sum(t.has_slot for t in flood[1:]) == 7
        for t in flood:
            t.done()
        await asyncio.gather(*waits)

    run(scenario())
    assert AdmissionLimits(max_running=4).max_running_per_client == 4  # under 8 slots: none kept


def test_a_client_is_an_ipv6_64_or_an_ipv4_address():
    admission = Admission(AdmissionLimits(max_running=2, max_queued=6))  # a client's share: 3 places
    for i in range(3):  # one host's /64 holds 2^64 addresses: new ones are the same client
        admission.admit(f"2001:db8:1:2::{i + 1:x}")
    with pytest.raises(ApiError) as refused:
        admission.admit("2001:db8:1:2:ffff:1:2:3")
    assert refused.value.status == 429 and refused.value.code == "client_queue_full"
    admission.admit("2001:db8:1:3::1")  # the next /64 is another client
    for i in range(3):  # IPv4 stays per address: a /24 holds many households behind NAT
        admission.admit(f"198.51.100.{i + 1}")
    admission.admit("::ffff:198.51.100.9")  # an IPv4 address written as IPv6 is that address
    assert admission.places_of["198.51.100.9"] == 1
