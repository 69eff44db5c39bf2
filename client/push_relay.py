"""Which hops of a chain get a step pushed by the peer before them, and which the client feeds.

With push, the client sends a step to one hop and each peer pushes its output on to the next
(peer/push.py): a *segment* of the chain. A segment ends before a hop the client must feed
itself (relay): one whose push failed, one whose session was opened next to another peer (the
hop after a repaired span takes pushes from no one), and one after a peer whose pushes were not
what it returned to the client (swarm/commitments.py). Relays last for the session. With
`push=False` every segment is one hop.

`HopClock` times each hop of a segment's decode step as the client sees it (client/observed.py).
"""

from __future__ import annotations

import time
from collections import Counter

from hexswarm.client.hop_links import LiveHop
from hexswarm.client.swarm_client import SwarmClient

WORK_UNTIMED_S = 0.001  # client work between two answers past which the next one is not timed


class PushPlan:
    """One session's pushes: where each segment ends, and the hop steps it counted."""

    def __init__(self, push: bool):
        self.push = push
        self.relayed: set[str] = set()  # session ids of hops a push into failed: the client feeds them
        # peers whose pushes were not what they returned to the client (swarm/commitments.py):
        # the client feeds the hop after each of them itself
        self.no_push_from: set[str] = set()
        # hop steps the client sent / that peers pushed; pushes that failed (then relayed)
        self.hop_steps: Counter[str] = Counter(sent=0, pushed=0, push_failed=0)

    def segment_end(self, hops: list[LiveHop], i: int) -> int:
        """One past the last hop that hop i's step reaches by pushes: each next hop must take
        pushes from the one before it (its session says so) and not have failed to."""
        end = i + 1
        if not self.push:
            return end
        while end < len(hops):
            hop, previous = hops[end], hops[end - 1].peer_id
            if hop.session_id in self.relayed or hop.upstream != previous or previous in self.no_push_from:
                break
            end += 1
        return end

    def sent(self, i: int, end: int) -> None:
        """A step went to hop i, to be pushed on to the hops before `end`."""
        self.hop_steps.update(sent=1, pushed=end - i - 1)

    def push_failed(self, hops: list[LiveHop], j: int, end: int) -> None:
        """Hop j could not push to hop j + 1: the client feeds that hop from now on, and the
        segment's hops after j were not pushed to."""
        self.relayed.add(hops[j + 1].session_id)
        self.hop_steps.update(push_failed=1)
        self.hop_steps.subtract(pushed=end - j - 1)

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
