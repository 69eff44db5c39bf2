"""Routing part of a chain: the blocks [start, end) of one failed hop (pure, no I/O).

Why a sub-view and not a new router: when one hop of a session fails, the client needs a
chain for that hop's blocks only, from any router. Clipping every peer to [start, end) and
shifting block numbers by -start gives an ordinary routing problem of end - start blocks,
which every `Router` already solves; the answer's hops are shifted back.

A sub-view gets a negative snapshot version, one per (full version, start, end): routers
cache per version, so a sub-problem must never share a cache entry with the whole model,
and `OwnPicks` ignores versions older than the newest it saw (a failover's pick does not
reset the client's tally of its own picks).
"""

from __future__ import annotations

from dataclasses import replace

from hexswarm.routing.chains.swarm_view import Hop, NoRouteError, Route, Router, RouteRequest, SwarmView


def span_view(view: SwarmView, start: int, end: int) -> SwarmView:
    """`view` restricted to blocks [start, end), renumbered from 0; peers outside it are left out."""
    if not 0 <= start < end <= view.num_blocks:
        raise ValueError(f"span [{start}, {end}) is not inside [0, {view.num_blocks})")
    peers = tuple(
        replace(p, start=max(p.start, start) - start, end=min(p.end, end) - start)
        for p in view.peers
        if p.start < end and p.end > start
    )
    width = view.num_blocks + 1
    version = -1 - ((max(view.version, 0) * width + start) * width + end)
    return replace(view, num_blocks=end - start, peers=peers, version=version)


def route_span(
    router: Router,
    view: SwarmView,
    request: RouteRequest,
    start: int,
    end: int,
    exclude: frozenset[str] = frozenset(),
) -> Route:
    """A chain covering blocks [start, end) only (hops in the model's block numbers), or NoRouteError."""
    if start == 0 and end == view.num_blocks:
        return router.choose(view, request, exclude)
    try:
        route = router.choose(span_view(view, start, end), request, exclude)
    except NoRouteError as e:
        missing = [b + start for b in e.missing_blocks]
        told = f"no eligible peer serves blocks {_ranges(missing)}" if missing else str(e)
        raise NoRouteError(missing, f"{told} (repairing blocks {start}:{end})") from None
    hops = tuple(Hop(h.peer_id, h.start + start, h.end + start) for h in route.hops)
    return replace(route, hops=hops)


def _ranges(blocks: list[int]) -> str:
    """'3:6, 9:10': sorted block numbers as start:end ranges, in the model's numbering."""
    ranges: list[list[int]] = []
    for b in sorted(set(blocks)):
        if ranges and ranges[-1][1] == b:
            ranges[-1][1] = b + 1
        else:
            ranges.append([b, b + 1])
    return ", ".join(f"{a}:{b}" for a, b in ranges)
