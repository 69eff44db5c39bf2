"""Admission control for the API: a bounded number of generations run, a bounded number wait.

A server that queues without bound fails late and for everyone: waits grow until every client
times out, and a flood of requests holds memory it never gives back. Production servers bound
what they accept instead and refuse the rest at once: Hugging Face's TGI answers 429 past
`--max-concurrent-requests`, and OpenAI's API answers 429 with a `Retry-After` header, which
its client libraries honour before they retry.

Here a request takes a *place* when it arrives (at most `max_running + max_queued` places) and
a *run slot* (at most `max_running`) when its generation may start. Between the two it is
queued: it is tokenized and checked, then waits in arrival order for a slot, for at most
`queue_timeout_s`. A request cancelled while queued (its client left) gives its place back and
never starts. A run slot is held until the generation's thread has ended, not merely until its
client left: the step in flight and the session's close still use that thread.

Queued requests are served fairly across clients: run slots go round-robin over the clients
that have requests waiting, oldest first within each, so a client that floods the queue waits
behind itself, not in front of everyone; and one client holds at most a quarter of the places
(`max_places_per_client`; at least the run slots and one more), so it cannot fill the queue. A
client is the address a request comes from (`client_of`): an IPv4 address, but an IPv6 /64,
since one host or home holds a /64 whole and draws new addresses from it at no cost (an IPv4
/24 is not one client: many households share one behind carrier NAT). One run slot in eight
(`reserved_slots`) is kept for clients that hold none: no client runs more than `max_running -
reserved_slots` generations at once, so a newcomer during a flood starts at once instead of
waiting for one of the flood's generations to end (an API of under 8 slots reserves none: a
lone user keeps all of them).

Everything here runs on the event loop; a generation thread hands its slot back through
`loop.call_soon_threadsafe(ticket.done)`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from hexswarm.client.api.schema import ApiError

MAX_RETRY_AFTER_S = 60  # past a minute the estimate says little; a client may poll /health instead
HOLD_TIME_SMOOTHING = 0.2  # weight of the newest hold time in the moving average


@dataclass(frozen=True)
class AdmissionLimits:
    """How many requests generate at once, how many may wait, and for how long."""

    max_running: int = 8  # generations at once, each in its own thread with its own swarm session
    # Four waiting per running slot: enough to ride out a burst, small enough that a queued
    # request still starts within a few generations' time rather than after minutes.
    max_queued: int = 64
    # A queued request's longest wait for a run slot; past it the answer is 503 with Retry-After.
    queue_timeout_s: float = 120.0

    @property
    def reserved_slots(self) -> int:
        """Run slots no one client may take: kept for clients running nothing (module docstring)."""
        return self.max_running // 8

    @property
    def max_running_per_client(self) -> int:
        return self.max_running - self.reserved_slots

    @property
    def max_places_per_client(self) -> int:
        """Places one client may hold: a quarter of all, and at least every run slot and one
        queued place (so a small API, as in `--max-concurrent 1 --max-queue 1`, still queues)."""
        return max((self.max_running + self.max_queued) // 4, self.max_running + 1)

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {self.max_running}")
        if self.max_queued < 0:
            raise ValueError(f"max_queued must be 0 or more, got {self.max_queued}")
        if not self.queue_timeout_s > 0:
            raise ValueError(f"queue_timeout_s must be positive, got {self.queue_timeout_s}")


def client_of(host: str) -> str:
    """The client a request from `host` counts as: an IPv4 address, the /64 of an IPv6 one (an
    IPv4-mapped one is its IPv4 address); anything that is no address (a name, "") as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6 and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.ip_network(f"{address}/64", strict=False)) if address.version == 6 else str(address)


class Admission:
    """Places and run slots of one API server (see the module docstring)."""

    def __init__(self, limits: AdmissionLimits):
        self.limits = limits
        self.places = 0  # requests admitted and not done: queued + running
        self.running = 0  # run slots held
        self.mean_hold_s = 0.0  # how long a run slot is held, smoothed; 0 until one is given back
        # client -> its queued requests' wake-ups, oldest first; clients in turn order
        self._waiters: OrderedDict[str, deque[asyncio.Future]] = OrderedDict()
        self.places_of: dict[str, int] = {}  # client -> places it holds
        self.running_of: dict[str, int] = {}  # client -> run slots it holds

    @property
    def queued(self) -> int:
        return self.places - self.running

    def admit(self, client: str = "") -> Ticket:
        """A place for one request of `client`; ApiError 429 with Retry-After, at once, when
        none is left, or when this client holds its share of them."""
        client = client_of(client)
        retry = self.retry_after_s()
        if self.places >= self.limits.max_running + self.limits.max_queued:
            raise ApiError(
                429,
                f"the API is at capacity ({self.running} generating, {self.queued} queued); "
                f"retry after {retry} s",
                "server_overloaded",
                code="queue_full",
                headers={"Retry-After": str(retry)},
            )
        share = self.limits.max_places_per_client
        if client and self.places_of.get(client, 0) >= share:  # "": origin unknown (in-process callers)
            raise ApiError(
                429,
                f"you have {share} requests generating or queued, your share of this API; retry after {retry} s",
                "rate_limit_exceeded",
                code="client_queue_full",
                headers={"Retry-After": str(retry)},
            )
        self.places += 1
        self.places_of[client] = self.places_of.get(client, 0) + 1
        return Ticket(self, client)

    def retry_after_s(self) -> int:
        """Seconds until a place is likely free: a run slot's mean hold time over the slots
        (one of them frees about that often), at least 1 and at most MAX_RETRY_AFTER_S."""
        expected = self.mean_hold_s / self.limits.max_running
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(expected)))

    async def _take_slot(self, client: str = "") -> None:
        """Waits (up to queue_timeout_s, TimeoutError after) for a run slot, in turn among clients."""
        waiting = any(self._may_run(c) for c in self._waiters)  # others that could take a slot
        if self.running < self.limits.max_running and not waiting and self._may_run(client):
            self.running += 1
            self._count_slot(client, 1)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(client, deque()).append(waiter)
        try:
            async with asyncio.timeout(self.limits.queue_timeout_s):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._count_slot(client, -1)
                self._hand_on()  # a slot was handed over just as this request gave up: pass it on
            else:
                waiter.cancel()
                queue = self._waiters.get(client)
                if queue is not None and waiter in queue:  # _hand_on may have dropped it, as cancelled
                    queue.remove(waiter)
                    if not queue:
                        del self._waiters[client]
            raise

    def _leave(self, client: str, held_slot_s: float | None) -> None:
        self.places -= 1
        self.places_of[client] -= 1
        if not self.places_of[client]:
            del self.places_of[client]
        if held_slot_s is not None:
            self.mean_hold_s += HOLD_TIME_SMOOTHING * (held_slot_s - self.mean_hold_s)
            self._count_slot(client, -1)
            self._hand_on()

    def _may_run(self, client: str) -> bool:
        return self.running_of.get(client, 0) < self.limits.max_running_per_client

    def _count_slot(self, client: str, change: int) -> None:
        self.running_of[client] = self.running_of.get(client, 0) + change
        if not self.running_of[client]:
            del self.running_of[client]

    def _hand_on(self) -> None:
        """A run slot was given back: to the oldest queued request of the first client in turn
        order that may run another (that client then goes to the back of the turn order), else
        to the pool."""
        for client in list(self._waiters):
            if not self._may_run(client):
                continue
            queue = self._waiters.pop(client)
            while queue and queue[0].done():  # cancelled meanwhile
                queue.popleft()
            if not queue:
                continue
            waiter = queue.popleft()
            if queue:
                self._waiters[client] = queue  # its next request waits for its next turn
            waiter.set_result(None)  # the slot moves over; `running` does not change
            self._count_slot(client, 1)
            return
        self.running -= 1


class Ticket:
    """One admitted request's place, and later its run slot."""

    def __init__(self, admission: Admission, client: str = ""):
        self._admission, self.client = admission, client
        self._slot_since: float | None = None  # monotonic time the run slot was taken
        self._done = False

    @property
    def has_slot(self) -> bool:
        return self._slot_since is not None

    async def wait_turn(self) -> None:
        """Waits in the queue for a run slot; ApiError 503 with Retry-After after queue_timeout_s."""
        try:
            await self._admission._take_slot(self.client)
        except TimeoutError:
            retry = self._admission.retry_after_s()
            waited = self._admission.limits.queue_timeout_s
            raise ApiError(
                503,
                f"no generation slot came free within {waited:g} s; retry after {retry} s",
                "service_unavailable",
                code="queue_timeout",
                headers={"Retry-After": str(retry)},
            ) from None
        self._slot_since = time.monotonic()

    def done(self) -> None:
        """Gives back the place, and the run slot if held. Idempotent; call it on the event loop."""
        if self._done:
            return
        self._done = True
        held = None if self._slot_since is None else time.monotonic() - self._slot_since
        self._admission._leave(self.client, held)
