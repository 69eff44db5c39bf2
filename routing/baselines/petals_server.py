"""Petals' server code that the Petals baseline needs: how many blocks a server takes, and the
throughput it announces (Petals 2.2.0, ported from its source; the rule that places the blocks
is `routing/scheduler/petals_rule.py`).

- `announced_throughput` is `get_server_throughput` (petals/server/throughput.py): the
  per-block forward rate divided by the mean blocks a request uses on the server,
  (num_blocks + 1) / 2, capped by the network rate (tokens of hidden_size x 16 bits).
- `server_num_blocks` is `Server._choose_num_blocks` (petals/server/server.py): as many blocks
  as fit in the TP group's memory, each with its attention cache (8192 tokens, 32768 for
  grouped-query attention), after 2 GiB x hidden / 14336 per device for autograd.
"""

from __future__ import annotations

_GIB = 1024**3


def announced_throughput(forward_rps: float, num_blocks: int, network_rps: float) -> float:
    """What a Petals server announces (tokens/s): its per-block forward rate over the mean blocks a
    request uses on it, (num_blocks + 1) / 2 (requests start at a uniform block), capped by the
    network rate."""
    if num_blocks < 1:
        raise ValueError("a server holds at least one block")
    return min(forward_rps / ((num_blocks + 1) / 2), network_rps)


def network_rps(bits_per_s: float, hidden_size: int) -> float:
    """Petals' network rate: requests of one 16-bit hidden state per second of the link."""
    return bits_per_s / (hidden_size * 16)


def server_num_blocks(
    memory_per_device: float,
    num_devices: int,
    block_bytes: float,
    hidden_size: int,
    kv_width: int,
    dtype_bytes: int,
) -> int:
    """How many blocks a Petals server fills its memory with (0 if not even one fits).

    A TP group's memory is its smallest device's times its size; each block needs its weights
    and its attention cache (K and V of `kv_width` values for 8192 tokens, 32768 when the model
    uses grouped-query attention, kv_width < hidden_size); autograd keeps 2 GiB per device
    (scaled by hidden size / 14336)."""
    grouped = kv_width < hidden_size
    cache_tokens = 32768 if grouped else 8192
    cache_bytes = 2 * kv_width * cache_tokens * dtype_bytes
    autograd = 2 * _GIB * num_devices / 14336 * hidden_size
    total = memory_per_device * num_devices
    return max(0, int((total - autograd) // (block_bytes + cache_bytes)))
