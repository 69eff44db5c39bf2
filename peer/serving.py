"""What a peer serves now, as one value: its blocks' core and stream server, their range and
tensor-parallel degree, and the speeds it announces for them.

A range move (peer/range_move.py) loads the new range beside the old one and then swaps the
whole value at once (`_Peer.swap` in peer/runtime.py, the only place it changes), so a record
never announces one range with another's speed, and streams opened before the swap stay on the
server they opened on. A group's re-partition (peer/tp/rebalance.py) swaps in its new measured
speed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hexswarm.peer.core import PeerCore
from hexswarm.peer.server import PeerServer

Speed = tuple[float, float]  # (prefill tokens/s, decode ms) per block


@dataclass(frozen=True)
class Serving:
    core: PeerCore
    server: PeerServer
    start: int
    end: int
    tp: int
    throughput: Speed  # what the record announces
    decode_batch: tuple[int, float]  # (sessions, tokens/s per block) of batched decode; 0: not measured
    weight_bytes: int = 0  # bytes one block's weights take over the whole group
    # `--tp auto`: the speed measured at each degree, announced as tp_speeds: ((degree, speed), ...)
    speeds: tuple[tuple[int, Speed], ...] = ()

    def _speeds_with(self, tp: int, speed: Speed) -> tuple[tuple[int, Speed], ...]:
        if not self.speeds:  # (kept by `--tp auto` peers only)
            return ()
        return tuple(sorted({**dict(self.speeds), tp: speed}.items()))

    def moved(self, core: PeerCore, server: PeerServer, start: int, end: int, tp: int, speed) -> Serving:
        """What serves after a move to [start, end) at degree `tp`; `speed` (throughput,
        decode_batch) is the new stack's when the degree changed, else None (the same)."""
        moved = replace(self, core=core, server=server, start=start, end=end, tp=tp)
        if speed is None:
            return moved
        throughput, decode_batch = speed
        return replace(
            moved, throughput=throughput, decode_batch=decode_batch, speeds=self._speeds_with(tp, throughput)
        )


def weight_bytes_per_block(blocks) -> int:
    """Bytes one block's weights take on this peer: a tensor-parallel group's leader holds 1/tp
    of each block (its `local` stack) and every rank as much, or with an uneven split its share
    of the block's weights (peer/tp/partition.py)."""
    local = getattr(blocks, "local", blocks)
    group = getattr(blocks, "group", None)
    if group is not None and group.repartitioner is not None and blocks.tp == group.tp:
        return int(local.weight_bytes_per_block() / group.repartitioner.weight_share(0))
    return local.weight_bytes_per_block() * blocks.tp
