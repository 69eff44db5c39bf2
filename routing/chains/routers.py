"""One entry point for the client: `make_router(mode, preference)` (Explorative Study, §II-B4's three modes)."""

from __future__ import annotations

from typing import Any

from hexswarm.routing.chains.max_throughput import MaxThroughputRouter
from hexswarm.routing.chains.min_latency import MinLatencyRouter
from hexswarm.routing.chains.swarm_view import Router
from hexswarm.routing.chains.tradeoff import TradeoffRouter

MODES = ("min_latency", "max_throughput", "tradeoff")


def make_router(mode: str, preference: float | None = None, **kw: Any) -> Router:
    """A router for `mode`; `preference` (0: latency .. 1: throughput) and `kw` go to "tradeoff" only."""
    if mode not in MODES:
        raise ValueError(f"unknown routing mode {mode!r}; valid modes: {', '.join(MODES)}")
    if mode == "tradeoff":
        return TradeoffRouter(preference, **kw)
    if preference is not None or kw:
        raise ValueError(f"mode {mode!r} takes no preference or options, got {preference!r}, {sorted(kw)}")
    return MinLatencyRouter() if mode == "min_latency" else MaxThroughputRouter()
