"""What every rank of a tensor-parallel group does over `torch.distributed`, the leader included.

The ranks join one process group (NCCL on CUDA, gloo on CPU) whose every collective times out
after `timeout_s`, so a hung rank fails its group instead of blocking it. A peer whose plan
chooses its degree serves at degree k on ranks 0..k-1: every rank builds the same sub-groups
right after joining (`subgroups`), and each stack of blocks loads with its all-reduces bound to
the sub-group of its degree (`load_shard`). A step's hidden states reach the ranks by a
broadcast from rank 0; commands do not (they go by pipe, peer/tp/messages.py), so an idle group
waits in `poll`, not in a collective that would time out.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hexswarm.peer.tp.profile import ComputeClock
from hexswarm.peer.tp.shard import Partition

if TYPE_CHECKING:
    from hexswarm.peer.tp.messages import RankSetup


def join_group(setup: RankSetup) -> None:
    """Joins the group's process group; every collective then times out after `timeout_s`."""
    device = torch.device(setup.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=setup.init_method,
        rank=setup.rank,
        world_size=setup.tp,
        timeout=timedelta(seconds=setup.timeout_s),
        device_id=device if device.type == "cuda" else None,  # binds NCCL to this rank's GPU
    )


def subgroups(size: int, degrees: tuple[int, ...]) -> dict[int, object]:
    """Degree -> its process group (ranks 0..k-1; None: the whole group). Every rank calls this
    once after joining, with the same arguments: creating a group is collective."""
    groups: dict[int, object] = {size: None}
    for k in sorted(set(degrees)):
        if 1 < k < size:
            groups[k] = dist.new_group(list(range(k)))
    return groups


def all_reduce_over(group) -> Callable[[torch.Tensor], None]:
    """Sums a tensor in place over `group` (the row-parallel layers' partial outputs)."""

    def all_reduce(tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, group=group)

    return all_reduce


def broadcast_from_leader(tensor: torch.Tensor, group=None) -> None:
    dist.broadcast(tensor, src=0, group=group)


def load_shard(
    spec,
    start: int,
    end: int,
    dtype: torch.dtype,
    device,
    rank: int,
    tp: int,
    group,
    quant: str = "none",
    partition: Partition | None = None,
    clock: ComputeClock | None = None,
):
    """This rank's share of blocks [start, end) at degree `tp` (whole blocks at degree 1): 1/tp
    of each layer, or its share of `partition`; linear layers in weight format `quant`; its
    all-reduces timed by `clock`."""
    from hexswarm.peer.blocks import BlockStack
    from hexswarm.peer.tp.shard import ShardPlan

    if tp == 1:
        return BlockStack.load(spec, start, end, dtype, device, quant=quant)
    plan = ShardPlan(spec.config, rank, tp, partition)
    all_reduce = all_reduce_over(group)
    if clock is not None:
        all_reduce = clock.wrap(all_reduce)
    return BlockStack.load(spec, start, end, dtype, device, plan, all_reduce, quant=quant)
