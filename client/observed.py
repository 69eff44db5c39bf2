"""What a client sees each peer take per block on decode steps: its own clock, not the peer's word.

A peer's record announces its speed (peer/throughput.py), and a signature proves only who
announced it. So the client times every decode step it routes (client/session.py): a hop it
sends to takes from the send to its answer, less the round trip it measured to that peer; a
hop that got the step pushed takes from the previous hop's answer to its own (its link from the
previous peer included: routing through it costs that too), less HOP_OVERHEAD_MS for what no
announced compute time includes. Per block, the median of the last WINDOW samples is the
peer's observed figure (robust to a stall or a GC pause).

A peer whose announced decode time is more than TRUST_FACTOR times faster than observed is
routed as LIAR_PENALTY times slower than observed (`effective_ms_per_block`), its announced
throughputs scaled down alike, and logged once; within that factor its own figures stand
(client timing includes the client's and the network's overhead, which the announced compute
time does not). The penalty is what makes lying cost. At merely its observed speed a caught
liar is judged by the client's clock while honest peers are judged by their own announcements,
which may be the slower of the two: in benchmarks/hostile.py a boaster of the same real speed
as its honest twin took 0.62 of the requests where the twin took 0.31. At twice its observed
time, over-announcing never pays.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass, field

from hexswarm.swarm.trust.speed_reports import TRUST_FACTOR  # one rule for routers and planners

logger = logging.getLogger(__name__)

WINDOW = 32  # samples kept per peer
MIN_SAMPLES = 8  # before an observation overrides an announcement
LIAR_PENALTY = 2.0  # a peer caught announcing beyond that is routed this many times slower than observed
MAX_SAMPLE_MS = 60_000.0  # per block; anything longer is a stall, not a speed
REROUTE_CHANGE = 0.25  # a routed figure changes only when what is observed moves by more
# Taken off every hop's time before it is divided by its blocks: the frames' encoding, the two
# event loops and a local link cost a few ms a hop that no announcement of compute includes.
HOP_OVERHEAD_MS = 5.0


@dataclass
class ObservedSpeeds:
    """Decode ms per block this client observed, per peer (thread-safe enough: one writer loop)."""

    samples: dict[str, deque] = field(default_factory=dict)
    flagged: set[str] = field(default_factory=set)  # peers routed by observation (logged once each)
    routed: dict[str, float] = field(default_factory=dict)  # the figure routing uses for each of them

    def add(self, peer_id: str, elapsed_ms: float, blocks: int) -> None:
        """One decode step of `blocks` blocks that took `elapsed_ms` as the client saw it."""
        if blocks <= 0 or not 0.0 <= elapsed_ms / blocks <= MAX_SAMPLE_MS:
            return
        per_block = max(0.0, elapsed_ms - HOP_OVERHEAD_MS) / blocks
        self.samples.setdefault(peer_id, deque(maxlen=WINDOW)).append(per_block)

    def ms_per_block(self, peer_id: str) -> float | None:
        """The observed decode ms per block (median), once there are MIN_SAMPLES samples."""
        window = self.samples.get(peer_id)
        if window is None or len(window) < MIN_SAMPLES:
            return None
        return statistics.median(window)

    def figures(self) -> dict[str, tuple[float, int]]:
        """peer id -> (observed ms per block, samples) for every peer with enough samples: what
        this client shares with the swarm's planners (swarm/trust/speed_reports.py)."""
        return {p: (statistics.median(w), len(w)) for p, w in self.samples.items() if len(w) >= MIN_SAMPLES}

    def effective_ms_per_block(self, peer_id: str, announced: float, name: str = "") -> float:
        """What routing should assume: the announcement, unless it is over TRUST_FACTOR times
        faster than what was observed (then LIAR_PENALTY x the observed figure)."""
        observed = self.ms_per_block(peer_id)
        if observed is None or observed <= TRUST_FACTOR * announced:
            self.routed.pop(peer_id, None)
            return announced
        if peer_id not in self.flagged:
            self.flagged.add(peer_id)
            logger.info(
                "peer %s announces %.3g ms per block, this client observes %.3g: routing it as %gx slower than that",
                name or peer_id[-8:],
                announced,
                observed,
                LIAR_PENALTY,
            )
        return self._steady(peer_id, _two_digits(LIAR_PENALTY * observed))

    def _steady(self, peer_id: str, figure: float) -> float:
        """`figure`, unless the one routing used last is within REROUTE_CHANGE of it: every new
        figure is a new view, which starts the routers' caches and their count of this client's
        own picks afresh (routing/chains/tradeoff.py), and a median's jitter is not news."""
        last = self.routed.get(peer_id)
        if last is not None and abs(figure - last) <= REROUTE_CHANGE * last:
            return last
        self.routed[peer_id] = figure
        return figure


def _two_digits(x: float) -> float:
    """Rounded to two significant digits: routers cache by what they see, which should not
    change with every sample's noise."""
    return float(f"{x:.2g}")
