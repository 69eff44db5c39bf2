"""How a check of each hop's output (client/verify.py) plugs into a session (client/session.py).

The session calls three hooks (`HopCheck`) and hands the check one record of what it may read
of the session (`CheckedSession`): the inputs the session keeps for failover, which a witness
replays, and the shape of its remote sessions. Neither side reaches into the other, so a
session runs the same with any check, or none, and a check can be tried on a fake session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from hexswarm.client.history import InputHistory
from hexswarm.client.hop_links import LiveHop
from hexswarm.client.swarm_client import SwarmClient
from hexswarm.swarm.models.model_spec import ModelSpec


@dataclass(frozen=True)
class CheckedSession:
    """What a check may read of its session."""

    swarm: SwarmClient
    spec: ModelSpec
    max_length: int  # tokens per sequence: a shadow session is opened as long
    batch_size: int
    dtype: torch.dtype  # of the hidden states on the wire
    history: InputHistory  # boundary -> what the session's hops were sent there (kept for failover)
    name: Callable[[str], str]  # peer id -> its name, for logs


class HopCheck(Protocol):
    """The hooks a session calls; a hook that raises a PeerError fails that hop over."""

    async def after_hop(
        self, hop: LiveHop, position: int, hidden_in: torch.Tensor, output: torch.Tensor
    ) -> None:
        """`hop` turned `hidden_in` (batch, tokens, H) at `position` into `output`; called before
        the step's inputs join the session's history."""

    def rolled_back(self, position: int) -> None:
        """The session dropped every token from `position` on (rejected drafts): forget them."""

    async def finish(self) -> None:
        """A generation is about to return: settle every step not checked yet."""

    def close(self) -> None:
        """The session closes: free what the check holds on peers."""
