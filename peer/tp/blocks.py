"""A stack of a tensor-parallel group's blocks as `PeerCore` sees it: one `BlockStack`'s interface.

`PeerCore` runs sessions on `TPBlocks` as it would on a one-process stack. Each step is sent to
every other rank of the stack (a `RunStep` over its pipe), the hidden states are broadcast from
rank 0, every rank runs its shard of the layers (all-reducing after each row-parallel module,
peer/tp/shard.py) and rank 0 returns its copy of the result. Opening and freeing a session's
cache reach every rank the same way, so no rank keeps a cache its leader has freed (close,
disconnect, idle expiry).

A stack runs at its own degree k, on ranks 0..k-1 (at degree 1 on the leader alone, with no
collective). `switch_to` moves the sessions to another split of the same blocks between two
steps (a re-partition, peer/tp/rebalance.py): every open session's keys and values are re-split
along the KV-head boundaries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import DynamicCache

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.tp.collectives import all_reduce_over, broadcast_from_leader
from hexswarm.peer.tp.messages import FreeCache, OpenCache, Resplit, RunStep
from hexswarm.peer.tp.shard import resplit_sessions
from hexswarm.swarm.wire.protocol import ErrorCode, ProtocolError

if TYPE_CHECKING:
    from hexswarm.peer.tp.partition import Repartitioner
    from hexswarm.peer.tp.profile import ComputeClock


class Group(Protocol):
    """What a stack needs of its group: the leader's `TPGroup` (peer/tp/group.py), which builds
    the stacks and so imports this module (this one names only the protocol)."""

    clock: ComputeClock  # rank 0's compute, apart from its waits
    repartitioner: Repartitioner | None  # the leader's drift check (auto only)

    @property
    def failure(self) -> str | None: ...

    def process_group(self, tp: int): ...

    def send_to(self, ranks: Iterable[int], message, *, quiet: bool = False) -> None: ...

    def note_decode(self, rank: int, stack_id: int, steps: int, compute_s: float) -> None: ...

    def fail(self, reason: str) -> None: ...

    def dead_rank(self, wait_s: float = 1.0) -> str | None: ...


@dataclass
class GroupCache:
    """Rank 0's share of a session's KV cache; the other ranks keep theirs under the same id."""

    session_id: str
    local: DynamicCache


class TPBlocks:
    """A stack of the group's blocks as PeerCore sees it: one BlockStack's interface, run on
    ranks 0..tp-1 (at degree 1, on the leader alone)."""

    def __init__(self, group: Group, local: BlockStack, stack_id: int, tp: int):
        self.group, self.local, self.stack_id, self.tp = group, local, stack_id, tp
        self.spec, self.start, self.end = local.spec, local.start, local.end
        self.dtype, self.device, self.config = local.dtype, local.device, local.config
        self.ranks = range(1, tp)  # the other ranks that hold a shard of this stack
        self.process_group = group.process_group(tp)
        self.caches: dict[str, GroupCache] = {}  # open sessions (their caches move in a re-partition)
        self.decode_step_s = [0, 0.0]  # [decode steps, seconds] of the group since the last reading
        self._lock = threading.Lock()  # a switch of split happens between two steps ...
        self._switching = threading.Lock()  # ... and not while a session's cache opens or closes

    def new_cache(self, session_id: str) -> GroupCache:
        with self._switching:  # not while a switch moves the caches (it lists them first)
            self.group.send_to(self.ranks, OpenCache(session_id, self.stack_id))
            cache = GroupCache(session_id, self.local.new_cache(session_id))
            self.caches[session_id] = cache
            return cache

    def release(self, session_id: str) -> None:
        with self._switching:
            self.caches.pop(session_id, None)
            self.group.send_to(self.ranks, FreeCache(session_id), quiet=True)

    @property
    def rolls_back(self) -> bool:
        """Every rank drops a session's rolled-back tokens itself, as the leader does (each runs
        BlockStack.forward with the step's position)."""
        return self.local.rolls_back

    def read_decode_step_s(self) -> tuple[float, int]:
        """The group's mean decode step (s) since the last reading, and how many steps."""
        steps, seconds = self.decode_step_s
        self.decode_step_s = [0, 0.0]
        return (seconds / steps if steps else float("nan")), steps

    def switch_to(self, new: TPBlocks) -> None:
        """Serves `new`'s stack (same blocks, another split) from the next step on: between two
        steps, every rank re-splits each open session's keys and values (peer/tp/shard.py
        `resplit_sessions`) and drops this stack."""
        with self._switching, self._lock:
            sessions = tuple((sid, _filled_layers(cache.local)) for sid, cache in self.caches.items())
            self.group.send_to(self.ranks, Resplit(self.stack_id, new.stack_id, sessions))
            local_caches = {sid: cache.local for sid, cache in self.caches.items()}
            all_reduce = all_reduce_over(new.process_group)
            for session_id, moved in resplit_sessions(
                self.local, new.local, sessions, local_caches, 0, all_reduce
            ).items():
                self.caches[session_id].local = moved
            self.local, self.stack_id = new.local, new.stack_id
            self.config = new.local.config

    def __call__(
        self, hidden: torch.Tensor, cache: GroupCache, position: int, start: int, end: int
    ) -> torch.Tensor:
        if self.group.failure is not None:  # (a stack of degree 1 sends nothing that would tell)
            raise ProtocolError(ErrorCode.PEER_FAILED, self.group.failure)
        if self.tp == 1:
            return self.local(hidden, cache.local, position, start, end)
        with self._lock:
            return self._step(hidden, cache, position, start, end)

    def _step(
        self, hidden: torch.Tensor, cache: GroupCache, position: int, start: int, end: int
    ) -> torch.Tensor:
        began = time.perf_counter()
        batch, tokens, width = hidden.shape
        step = RunStep(cache.session_id, position, start, end, (batch, tokens, width), self.stack_id)
        self.group.send_to(self.ranks, step)
        try:
            hidden = hidden.contiguous()
            broadcast_from_leader(hidden, self.process_group)
            self.group.clock.begin_step()
            output = self.local(hidden, cache.local, position, start, end)
            observed = self.group.repartitioner is not None  # only a drift check reads them
            if observed and (batch, tokens) == (1, 1):  # decode steps are what the split is sized for
                self.group.note_decode(0, self.stack_id, 1, self.group.clock.end_step())
                self.decode_step_s[0] += 1
                self.decode_step_s[1] += time.perf_counter() - began
            return output
        except (RuntimeError, OSError) as e:  # torch.distributed raises RuntimeError subclasses
            self.group.fail(self.group.dead_rank() or f"a collective failed: {type(e).__name__}: {e}")
            raise ProtocolError(ErrorCode.PEER_FAILED, self.group.failure or str(e)) from None


def _filled_layers(cache: DynamicCache) -> tuple[tuple[int, int, int], ...]:
    """(local layer, batch, length) of each layer of `cache` that holds keys and values."""
    return tuple(
        (index, layer.keys.shape[0], layer.keys.shape[2])
        for index, layer in enumerate(cache.layers)
        if getattr(layer, "is_initialized", False) and layer.keys.numel()
    )
