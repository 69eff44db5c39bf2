"""Routing part of a chain (routing.chains.span) with every router."""

import pytest

from hexswarm.routing.chains.routers import make_router
from hexswarm.routing.chains.span import route_span, span_view
from hexswarm.routing.chains.swarm_view import NoRouteError, PeerView, RouteRequest, SwarmView


def _view() -> SwarmView:
    peers = (
        PeerView("a", 0, 4, 1000, 1.0, 10_000),
        PeerView("b", 2, 6, 1000, 1.0, 10_000),
        PeerView("c", 3, 5, 1000, 1.0, 10_000),
        PeerView("d", 4, 8, 1000, 1.0, 10_000),
    )
    return SwarmView(8, peers, {p.peer_id: 5.0 for p in peers}, hidden_size=64, version=7)


def test_span_view_clips_and_renumbers_peers():
    sub = span_view(_view(), 3, 6)
    assert sub.num_blocks == 3
    assert {(p.peer_id, p.start, p.end) for p in sub.peers} == {
        ("a", 0, 1),
        ("b", 0, 3),
        ("c", 0, 2),
        ("d", 1, 3),
    }
    assert sub.version < 0 and sub.version != span_view(_view(), 3, 5).version


@pytest.mark.parametrize("mode", ["min_latency", "max_throughput", "tradeoff"])
def test_route_span_covers_the_span_without_excluded_peers(mode):
    kwargs = {"background": False} if mode == "tradeoff" else {}
    router = make_router(mode, **kwargs)
    request = RouteRequest(prompt_tokens=16, new_tokens=0)
    route = route_span(router, _view(), request, 2, 6, exclude=frozenset({"b"}))
    assert route.hops[0].start == 2 and route.hops[-1].end == 6
    assert all(h.end == n.start for h, n in zip(route.hops, route.hops[1:], strict=False))
    assert "b" not in {h.peer_id for h in route.hops}


def test_route_span_names_missing_blocks_in_model_numbers():
    with pytest.raises(NoRouteError) as info:
        route_span(make_router("min_latency"), _view(), RouteRequest(16, 0), 4, 8, exclude=frozenset({"d"}))
    assert info.value.missing_blocks == [6, 7]
    # the message too: blocks 6:8 of the model, not 2:4 of the span being repaired
    assert "no eligible peer serves blocks 6:8 (repairing blocks 4:8)" == str(info.value), str(info.value)
