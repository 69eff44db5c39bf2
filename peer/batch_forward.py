"""One forward pass for the decode steps of many sessions at once (batched decode).

Decode is memory-bound: a one-token step reads every weight of a layer for a few flops, so
stacking the current token of many sessions into one matrix product costs little more than
one step (the Orca / vLLM observation). Sessions differ in length and position, and each
keeps its own transformers `DynamicCache`; this module lets the unchanged decoder-layer
classes run over all of them:

- the rows of all sessions are concatenated on the batch axis, each with its own position
  id (so rotary embeddings are each session's own);
- `GatheredCache` stands in for the cache: in each layer it appends every session's new
  keys/values to that session's cache, then returns all of them right-padded to a common
  key length (`key_slots`) and stacked, so attention runs as one batched call;
- an additive mask (0 or -inf) hides each row's padding. A decode step is one query token,
  so the mask needs no causal part: the token may see all of its own session's keys.

Why the common key length is rounded up on CUDA: for half precision on Hopper, torch 2.11
tries cuDNN attention first, and cuDNN builds a graph on the host the first time it meets a
shape (about 0.2-0.7 s seen on an H200). The key length used to grow by one every step, so
every batched step was a new shape: 8 sessions of a 7B-shaped block decoded at 185 tokens/s
per block instead of about 5,000 (benchmarks/gpu_check.py --probe). Rounded up to
KEY_SLOT_MULTIPLE, one graph per (rows, slots, dtype) serves the next steps: a build is paid
once per 128 tokens of growth for each batch size, and never again once cached. The padded
keys are masked out and cost little (a decode step reads the weights, not the keys). The mask
is float in the model's dtype, as torch would convert a boolean one anyway, because cuDNN ran
faster with it (6.0 vs 10.6 ms a step on the same shapes). On the CPU no kernel is built per
shape, so keys are not padded there.

Only full-attention layers are batched (no sliding window: its cache keeps a rolling window
whose mask would differ per layer kind); other stacks run their sessions one at a time.
Greedy tokens are the same as unbatched; logits can differ in the last float bits, since
batched matrix products sum in another order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache

from hexswarm.swarm.models import architectures


class GatheredCache:
    """What the decoder layers see as their cache during a batched decode step.

    Row block i (of `rows[i]` rows) belongs to `caches[i]`. Only `update` is called by the
    attention modules of the batchable architectures (see BlockStack.supports_batching).
    """

    def __init__(self, caches: Sequence[DynamicCache], rows: Sequence[int], key_slots: int):
        self.caches, self.rows = list(caches), list(rows)
        self.total_rows = sum(rows)
        self.key_slots = key_slots  # the padded key length every row is stacked to

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        _, heads, _, head_dim = key_states.shape
        shape = (self.total_rows, heads, self.key_slots, head_dim)
        keys = key_states.new_zeros(shape)
        values = value_states.new_zeros(shape)
        row = 0
        for cache, n in zip(self.caches, self.rows, strict=True):
            k, v = cache.update(key_states[row : row + n], value_states[row : row + n], layer_idx)
            length = k.shape[2]
            keys[row : row + n, :, :length] = k
            values[row : row + n, :, :length] = v
            row += n
        return keys, values


# device type -> the multiple the stacked key length is rounded up to (see the module docstring)
KEY_SLOT_MULTIPLE = {"cuda": 128}


def key_slots(key_lengths: Sequence[int], device: torch.device) -> int:
    """How many key positions the stacked keys/values have: the longest session's, rounded up
    on devices whose attention kernels are built per shape."""
    multiple = KEY_SLOT_MULTIPLE.get(device.type, 1)
    return -(-max(key_lengths) // multiple) * multiple


def padding_mask(
    rows: Sequence[int], key_lengths: Sequence[int], slots: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """(total_rows, 1, 1, slots) additive mask in `dtype`: 0 on each row's own keys, -inf on
    the padding after them (every row has at least its new key, so no row is all -inf)."""
    lengths = torch.tensor(
        [length for n, length in zip(rows, key_lengths, strict=True) for _ in range(n)], device=device
    )
    keys = torch.arange(slots, device=device)
    padding = (keys.unsqueeze(0) >= lengths.unsqueeze(1))[:, None, None, :]
    return torch.zeros(padding.shape, dtype=dtype, device=device).masked_fill_(padding, float("-inf"))


@torch.inference_mode()
def decode_batch(
    layers: nn.ModuleList,
    rotary_emb: nn.Module,
    hiddens: Sequence[torch.Tensor],
    caches: Sequence[DynamicCache],
    positions: Sequence[int],
    first: int,
    last: int,
) -> list[torch.Tensor]:
    """Runs one new token of each session through local layers [first, last).

    hiddens[i]: (batch_i, 1, hidden_size); caches[i] holds positions[i] tokens per row in
    those layers. Returns each session's output rows, in order.
    """
    rows = [h.shape[0] for h in hiddens]
    device = hiddens[0].device
    hidden = torch.cat(list(hiddens), dim=0)
    position_ids = torch.tensor(
        [[p] for n, p in zip(rows, positions, strict=True) for _ in range(n)], device=device
    )
    key_lengths = [p + 1 for p in positions]
    slots = key_slots(key_lengths, device)
    mask = padding_mask(rows, key_lengths, slots, hidden.dtype, device)
    cache = GatheredCache(caches, rows, slots)
    position_embeddings = rotary_emb(hidden, position_ids)
    cache_kwarg = architectures.cache_argument(type(layers[first]).forward)
    for i in range(first, last):
        hidden = layers[i](
            hidden,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            position_embeddings=position_embeddings,
            **{cache_kwarg: cache},
        )
    return list(torch.split(hidden, rows, dim=0))
