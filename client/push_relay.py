"""Which hops of a chain get a step pushed by the peer before them, and which the client feeds.

With push, the client sends a step to one hop and each peer pushes its output on to the next
(peer/push.py): a *segment* of the chain. A segment ends before a hop the client must feed
itself (relay): one whose push failed, one whose session was opened next to another peer (the
hop after a repaired span takes pushes from no one), and one after a peer whose pushes were not
what it returned to the client (swarm/wire/commitments.py). The last two last for the session. A
failed push is often passing (a first dial that ran out of time on a loaded machine), so after
one the client relays that hop for a few steps, then lets a push try again: 4 steps after the
first failure in a row, twice as many after each next one (at most 256); a push that goes
through resets the count. The pushing peer backs off its dials too (peer/push.py), so a retry
into a peer it cannot reach fails at once. With `push=False` every segment is one hop.

`HopClock` times each hop of a segment's decode step as the client sees it (client/observed.py).
"""

from __future__ import annotations

import time
from collections import Counter

from hexswarm.client.hop_links import LiveHop
from hexswarm.client.swarm_client import SwarmClient

WORK_UNTIMED_S = 0.001  # client work between two answers past which the next one is not timed
RELAY_FIRST_STEPS = 4  # steps a hop is relayed after its first failed push in a row
RELAY_MAX_STEPS = 256  # ... doubling with each failure in a row, up to this


class PushPlan:
    """One session's pushes: where each segment ends, and the hop steps it counted."""

    def __init__(self, push: bool):
        self.push = push
        # session id of a hop a push into failed -> (failures in a row, the step from which a
        # push may try again); the client feeds that hop until then
        self.relayed: dict[str, tuple[int, int]] = {}
        self.step = 0  # steps this session began
        # peers whose pushes were not what they returned to the client (swarm/wire/commitments.py):
        # the client feeds the hop after each of them itself
        self.no_push_from: set[str] = set()
        # hop steps the client sent / that peers pushed; pushes that failed (then relayed)
        self.hop_steps: Counter[str] = Counter(sent=0, pushed=0, push_failed=0)

    def next_step(self) -> None:
        """The session begins its next step (prefill, decode or replay)."""
        self.step += 1

    def segment_end(self, hops: list[LiveHop], i: int) -> int:
        """One past the last hop that hop i's step reaches by pushes: each next hop must take
        pushes from the one before it (its session says so) and not be relayed at this step
        after a failed push."""
        end = i + 1
        if not self.push:
            return end
        while end < len(hops):
            hop, previous = hops[end], hops[end - 1].peer_id
            if self._relaying(hop.session_id) or hop.upstream != previous or previous in self.no_push_from:
                break
            end += 1
        return end

    def _relaying(self, session_id: str) -> bool:
        return self.step < self.relayed.get(session_id, (0, -1))[1]

    def sent(self, i: int, end: int) -> None:
        """A step went to hop i, to be pushed on to the hops before `end`."""
        self.hop_steps.update(sent=1, pushed=end - i - 1)

    def push_failed(self, hops: list[LiveHop], j: int, end: int) -> int:
        """Hop j could not push this step to hop j + 1: the client feeds that hop for a while
        (returned: how many steps), and the segment's hops after j were not pushed to."""
        session_id = hops[j + 1].session_id
        failures = self.relayed.get(session_id, (0, 0))[0] + 1
        steps = min(RELAY_MAX_STEPS, RELAY_FIRST_STEPS * 2 ** min(failures - 1, 16))
        self.relayed[session_id] = (failures, self.step + steps)
        self.hop_steps.update(push_failed=1)
        self.hop_steps.subtract(pushed=end - j - 1)
        return steps

    def pushed_into(self, hop: LiveHop) -> None:
        """A push into `hop` went through: its next failure starts the count again."""
        self.relayed.pop(hop.session_id, None)

    def distrust(self, peer_id: str) -> None:
        """`peer_id` pushed something other than what it returned: feed the hop after it."""
        self.no_push_from.add(peer_id)


class HopClock:
    """Times each hop of one segment's decode step as the client sees it (client/observed.py):
    the first hop from the send to its answer less the round trip, each pushed hop from the
    previous answer to its own. After the client worked in between (a verification check), the
    next answer may have waited in its stream, so it is not timed."""

    def __init__(self, swarm: SwarmClient, sent: float, decode: bool):
        self.swarm, self.last, self.decode = swarm, sent, decode

    def answered(self, hop: LiveHop, first: bool) -> None:
        now = time.perf_counter()
        if self.decode and self.last is not None:
            rtt_ms = self.swarm.rtt_ms.get(hop.peer_id, (0.0, 0.0))[0] if first else 0.0
            self.swarm.observed.add(hop.peer_id, 1000 * (now - self.last) - rtt_ms, hop.end - hop.start)
        self.last = now

    def worked_since(self, began: float) -> None:
        if time.perf_counter() - began > WORK_UNTIMED_S:
            self.last = None
