"""Replacing the hops of a span and replaying its inputs: how a session opens and repairs.

`SpanRepair.replace(start, end, inputs)` is the one repair operation, used both to open a
session (blocks [0, L), nothing to replay) and to repair a failed hop:

1. choose a chain for blocks [start, end) without the failed peers (client.chain_choice);
2. open a session on each new hop (client.hop_links);
3. replay `inputs` (every hidden state the span has seen, the current step's included)
   through the new hops as prefill, chained, so each rebuilds its KV cache;
4. on any peer error, ban that peer and spend one attempt of the call's budget
   (client.peer_failures), back off (client.retry) and start again at 1.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field

import torch

from hexswarm.client.chain_choice import ChainChooser, NoChainError
from hexswarm.client.hop_links import HopLinks, LiveHop
from hexswarm.client.peer_failures import PeerFailures, short_error
from hexswarm.client.remote import PeerError
from hexswarm.client.retry import backoff_delay
from hexswarm.routing.chains.swarm_view import NoRouteError

REPLAY_CHUNK_BYTES = 16 << 20  # one replay frame at most (peers accept 64 MiB by default)


@dataclass(frozen=True)
class Replacement:
    """New hops for a span, and what the replay through them gave."""

    hops: list[LiveHop]
    seen: dict[int, torch.Tensor]  # new hop's start -> the replay's input there (batch, tokens, H)
    output: torch.Tensor | None  # (batch, tokens, H) at the span's end; None with nothing replayed


@dataclass
class SpanRepair:
    """Opens new hops for a span and replays its inputs through them, retrying on failures."""

    chooser: ChainChooser
    links: HopLinks
    failures: PeerFailures
    rng: random.Random = field(default_factory=random.Random)

    async def replace(
        self,
        start: int,
        end: int,
        inputs: torch.Tensor | None,
        upstream: str = "",
        formats: dict[int, str] | None = None,
    ) -> Replacement:
        """New hops for blocks [start, end), with `inputs` (batch, tokens, H) replayed through
        them; the first takes pushes from `upstream` (the peer of the hop before `start`), each
        other one from the hop before it. With `formats` (block -> weight format), each block
        goes to a peer of the format that served it before: the recovered output is what the
        old chain's was. Raises FailoverError when the budget is spent, NoChainError when no
        chain formed before the session's coverage timeout."""
        for attempt in itertools.count():  # until it works or the budget raises FailoverError
            await asyncio.sleep(backoff_delay(attempt, self.failures.policy, self.rng))
            hops: list[LiveHop] = []
            try:
                route = await self.chooser.route(start, end, formats)
                # Nothing to replay (a session opening): its first step follows the OPENs at once.
                hops = await self.links.open(route, upstream, pipelined=inputs is None)
                return await self._replay_all(hops, inputs)
            except NoRouteError as e:
                self.failures.failed(None, start, end, f"no route: {e}")
                if self.chooser.no_route_past_deadline():
                    raise NoChainError(self.chooser.spec.model_id, e) from None
                await self.chooser.wait_for_peers(start, end)
            except PeerError as e:
                self.links.drop(hops)
                span = next(((h.start, h.end) for h in hops if h.peer_id == e.peer_id), (start, end))
                self.failures.failed(e.peer_id, *span, short_error(e), e.code)
            except BaseException:  # cancelled mid-replay: the new hops are nobody's yet
                self.links.drop(hops)
                raise
        raise AssertionError("unreachable")

    async def _replay_all(self, hops: list[LiveHop], inputs: torch.Tensor | None) -> Replacement:
        """Replays `inputs` (batch, tokens, H) through `hops` in order, noting what each start saw."""
        seen: dict[int, torch.Tensor] = {}
        hidden = inputs
        for hop in hops:
            if hidden is None:
                break
            seen[hop.start] = hidden
            hidden = await self._replay(hop, hidden)
        return Replacement(hops, seen, hidden)

    async def _replay(self, hop: LiveHop, hidden: torch.Tensor) -> torch.Tensor:
        """hidden through one hop as prefill, in chunks of at most REPLAY_CHUNK_BYTES."""
        per_token = hidden.shape[0] * hidden.shape[2] * hidden.element_size()
        chunk = max(1, REPLAY_CHUNK_BYTES // per_token)
        outputs = []
        for position in range(0, hidden.shape[1], chunk):
            piece = hidden[:, position : position + chunk].contiguous()
            outputs.append(await self.links.run(hop, piece, position))
        return torch.cat(outputs, dim=1)
