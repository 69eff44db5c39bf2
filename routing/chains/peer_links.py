"""What a pushed chain pays between its peers (pure, no I/O): routes for the WAN.

With pushes a step crosses client → first peer → … → last peer → client: k + 1 one-way trips
for k hops, one per link. `Candidates.overhead_ms` prices each hop as if the client relayed it
(a client ↔ peer round trip), which counts a chain's first and last crossings right but prices
the crossing from peer j to peer i as rtt(c, j) / 2 + rtt(c, i) / 2. Where the two peers have
measured their link, the difference is added when a hop on i follows a hop on j:

    follow_ms[j, i] = link(j, i) / 2 − (rtt(c, j) + rtt(c, i)) / 2

so a chain costs rtt(c, first) / 2 + Σ link / 2 + rtt(last, c) / 2 plus compute and transfer
(the one-way trips it really pays), and with no measured link exactly the client-relayed price.

Links are peers' claims (their records' `links`, peer/link_probe.py), so the client keeps,
per pair, the larger of the two ends' reports (a peer can lower only its own), and this module
never prices a link below what the client's own round trips allow by the triangle inequality:
link(j, i) ≥ |rtt(c, j) − rtt(c, i)|.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# A reported round trip past this is no measurement (a probe gives up after 2 s).
MAX_LINK_MS = 10_000.0

Pair = tuple[str, str]


def pair(a: str, b: str) -> Pair:
    """The key of the link between peers a and b (either order)."""
    return (a, b) if a <= b else (b, a)


def links_from_reports(reports: Sequence[tuple[str, Iterable[tuple[str, float]]]]) -> dict[Pair, float]:
    """(peer id, its reported (other, ms) pairs) → pair → round trip between two of the reporting
    peers: the larger of both ends' reports, so a peer that under-reports its links is corrected
    by the other end's report."""
    among = {peer_id for peer_id, _ in reports}
    links: dict[Pair, float] = {}
    for peer_id, reported in reports:
        for other, ms in reported:
            if other == peer_id or other not in among or not 0.0 <= ms <= MAX_LINK_MS:
                continue
            key = pair(peer_id, other)
            links[key] = max(ms, links.get(key, 0.0))
    return links


def follow_matrix(
    peer_ids: Sequence[str], client_rtt_ms: Sequence[float], links: dict[Pair, float]
) -> np.ndarray | None:
    """(n, n) ms added when a hop on peer i follows a hop on peer j (the module's formula);
    0 where the link is not measured, +inf on the diagonal (a peer never follows itself).
    None when no link among `peer_ids` is measured: the client-relayed price stands."""
    index = {p: i for i, p in enumerate(peer_ids)}
    known = [(index[a], index[b], ms) for (a, b), ms in links.items() if a in index and b in index]
    if not known:
        return None
    rtt = np.asarray(client_rtt_ms, dtype=float)
    follow = np.zeros((len(peer_ids), len(peer_ids)))
    for j, i, ms in known:
        link = max(ms, abs(rtt[j] - rtt[i]))  # the triangle inequality's floor
        follow[j, i] = follow[i, j] = (link - rtt[j] - rtt[i]) / 2
    np.fill_diagonal(follow, np.inf)
    return follow
