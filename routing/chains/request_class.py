"""Request classes: requests that share one cached front in the trade-off mode (pure, no I/O)."""

from __future__ import annotations

from hexswarm.routing.chains.cost import request_cache_tokens
from hexswarm.routing.chains.swarm_view import RouteRequest

# (batch_size, cache tokens, new tokens), the counts rounded up to powers of two
RequestClass = tuple[int, int, int]


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def request_class(request: RouteRequest) -> RequestClass:
    """Requests of one class share a front: same batch, cache need and new tokens within a power of two."""
    return request.batch_size, _pow2(request_cache_tokens(request)), _pow2(request.new_tokens)


def class_cache_floor(cls: RequestClass) -> int:
    """The least cache any request of the class takes: a peer with less can carry none of them.

    A class's front is built on the peers with this much cache left, and each decision drops
    the chains through peers without room for its own request (routing.chains.tradeoff);
    built on the class's bound instead, a front left out peers that had room for this one.
    """
    tokens = cls[1]
    return tokens // 2 + 1 if tokens > 1 else 1


def class_request(cls: RequestClass) -> RouteRequest:
    """The most demanding request of a class, whose costs its front is scored by.

    Its cache need is the class's bound; the new tokens (which set how the load-aware cost
    weighs prefill against decode) are the class's bound too, unless that leaves no prompt.
    """
    batch, tokens, new = cls
    per_row = -(-tokens // batch)
    new = min(new, per_row - 1)
    return RouteRequest(prompt_tokens=per_row - new, new_tokens=new, batch_size=batch)
