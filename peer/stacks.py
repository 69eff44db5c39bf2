"""Where a peer's stacks of blocks load: on its one device, or over the tensor-parallel group
(peer/tp/group.py) that its first stack starts with `--tp K`.

The peer loads its first stack here at start (peer/runtime.py); a range move loads the next
one beside it and frees the old one once its sessions have drained (peer/range_move.py). Both
get this object rather than the peer, so a move touches the blocks and nothing else of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.config import PeerConfig
from hexswarm.peer.core import Blocks
from hexswarm.peer.devices import describe
from hexswarm.peer.tp.group import TPGroup


class Stacks:
    """Loads and frees the stacks of a peer started with `config`. `on_group_failure(reason)`
    is called from the group's watcher thread when a rank dies or hangs."""

    def __init__(self, config: PeerConfig, on_group_failure: Callable[[str], None]):
        self.config = config
        self.on_group_failure = on_group_failure
        self.group: TPGroup | None = None  # with --tp K, once the first stack has loaded
        self.device_info: tuple = ()  # what the record announces of its devices

    async def load_first(self) -> Blocks:
        """The stack of the range the peer starts at (and its group, with --tp K)."""
        c = self.config
        if c.tp == 1:
            device = c.devices[0]
            threads = torch.get_num_threads() if device.type == "cpu" else None
            self.device_info = (describe(device, threads),)
            return await asyncio.to_thread(
                BlockStack.load, c.spec, c.start, c.end, c.dtype, device, quant=c.quant
            )
        self.group = TPGroup(
            c.spec,
            c.start,
            c.end,
            c.dtype,
            c.devices,
            c.tp_timeout,
            self.on_group_failure,
            c.tp_choices,
            quant=c.quant,
            partition=c.partition,
            slowdowns=c.slowdowns,
        )
        blocks = await asyncio.to_thread(self.group.launch)
        self.device_info = self.group.device_info
        return blocks

    def load(self, start: int, end: int, tp: int) -> Blocks:
        """Another stack, [start, end) at degree `tp`, beside the one serving (it blocks: run it
        in a thread)."""
        if self.group is not None:
            return self.group.load_stack(start, end, tp)
        c = self.config
        return BlockStack.load(c.spec, start, end, c.dtype, c.devices[0], quant=c.quant)

    def drop(self, blocks: Blocks) -> None:
        """Frees a stack no session uses any more on every rank (one device's goes with its core)."""
        if self.group is not None:
            self.group.drop_stack(blocks)

    async def close(self) -> None:
        """Stops the group's ranks, if it has any."""
        if self.group is not None:
            await asyncio.to_thread(self.group.stop)
