"""The transformer blocks [start, end) a peer serves: loading them and running one step.

Blocks are transformers' own decoder-layer classes of the model's family (found from its
config: swarm/models/architectures.py), built with parameters on the meta device and local
indices against a config that describes only this slice (see `config_for_blocks`), then
filled from just this slice's tensors in the checkpoint. A session's KV cache is a plain
transformers `DynamicCache` over the slice, so attention, rotary embeddings, GQA, biases
and sliding windows behave exactly as in the full model.

A tensor-parallel rank builds the same stack from its shard of each layer (`peer/tp/shard.py`):
layers with its share of the heads and MLP width (1/K, or an uneven `Partition`), plus an
all-reduce after each row-parallel module.

A quantized stack (`quant` int8 or nf4, peer/quant.py) reads and quantizes one block at a
time, so loading never holds more than one block in full precision.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from hexswarm.peer import quant as weight_quant
from hexswarm.peer.batch_forward import decode_batch
from hexswarm.peer.tp.shard import AllReduce, ShardPlan, all_reduce_after_row_parallel
from hexswarm.swarm.models import architectures
from hexswarm.swarm.models.checkpoint import CheckpointError, load_tensors, strip_prefix
from hexswarm.swarm.models.model_spec import ModelSpec, config_for_blocks
from hexswarm.swarm.tools import log_setup

logger = logging.getLogger(__name__)

# Architectures whose attention only calls `cache.update` (what peer/batch_forward.py provides),
# so their decode steps can be batched across sessions when no layer uses a sliding window.
_BATCHABLE = {"llama", "mistral", "qwen2"}


class BlockStack(nn.Module):
    """Blocks [start, end) of one model, ready to run steps of inference sessions."""

    def __init__(
        self,
        spec: ModelSpec,
        start: int,
        end: int,
        dtype: torch.dtype,
        device: torch.device,
        shard: ShardPlan | None = None,
        quant: str = weight_quant.DEFAULT_QUANT,
    ):
        super().__init__()
        spec.check_range(start, end)
        self.spec, self.start, self.end = spec, start, end
        self.dtype, self.device = dtype, device
        self.shard = shard
        self.quant = quant
        self.config = config_for_blocks(spec.config, start, end)
        if shard is not None:
            self.config = shard.local_config(self.config)
        architectures.choose_implementations(self.config)
        # the family's own layer classes (swarm/models/architectures.py), parameters on meta until loaded
        self.layers, self.rotary_emb = architectures.build_layers(self.config, device)
        self.layer_types = architectures.layer_types(self.config)

    @classmethod
    def load(
        cls,
        spec: ModelSpec,
        start: int,
        end: int,
        dtype: torch.dtype,
        device: torch.device,
        shard: ShardPlan | None = None,
        all_reduce: AllReduce | None = None,
        quant: str = weight_quant.DEFAULT_QUANT,
    ) -> BlockStack:
        """Builds the blocks and loads their weights, logging progress per checkpoint file.

        With `shard`, only this rank's slice of each tensor is read, and `all_reduce` sums
        the row-parallel outputs over the tensor-parallel group. With `quant` other than
        "none", each block's linear layers are quantized as soon as that block is read.
        """
        if (shard is None) != (all_reduce is None):
            raise ValueError("a tensor-parallel shard needs an all_reduce, and only it does")
        began = time.perf_counter()
        stack = cls(spec, start, end, dtype, device, shard, quant)
        if quant == "none":  # everything in one read: the fewest file opens
            stack._load_blocks(range(start, end), shard, all_reduce, progress=f"loading [{start}:{end})")
        else:  # a block at a time, so that only one block is ever held in full precision
            desc = f"loading [{start}:{end}) as {quant}"
            with log_setup.progress(total=end - start, desc=desc, unit="block") as bar:
                for index in range(start, end):
                    stack._load_blocks(range(index, index + 1), shard, all_reduce, progress=None)
                    bar.update()
            weight_quant.release_freed_memory()  # the full-precision blocks' pages, to the system
        stack.eval()
        logger.info(
            "%s [%d:%d): loaded in %.1f s (%s%s, %s%s)",
            spec.model_id,
            start,
            end,
            time.perf_counter() - began,
            dtype,
            f", {quant} weights, {stack.weight_bytes_per_block() / 2**20:.1f} MiB a block"
            if quant != "none"
            else "",
            device,
            f", tensor-parallel rank {shard.rank} of {shard.tp}" if shard else "",
        )
        return stack

    def _load_blocks(
        self, blocks: range, shard: ShardPlan | None, all_reduce: AllReduce | None, progress: str | None
    ) -> None:
        """Reads global blocks `blocks` from the checkpoint into their layers (quantized if asked)."""
        prefixes = tuple(f"model.layers.{i}." for i in blocks)

        def on_file(path, n_tensors):  # a GGUF file's folder has a file per block: not worth a line each
            logger.debug(
                "[%d:%d): reading %d tensors from %s", blocks[0], blocks[-1] + 1, n_tensors, path.name
            )

        tensors = load_tensors(
            self.spec.path,
            lambda name: name.startswith(prefixes),
            self.dtype,
            on_file,
            slice_of=shard.slice_of if shard else None,
            progress=progress,
        )
        if shard is not None:
            tensors = {name: shard.finish(name, t) for name, t in tensors.items()}
        tensors = architectures.convert_checkpoint_tensors(self.spec.config, tensors)  # e.g. fuse MoE experts
        for global_index in blocks:
            layer_tensors = strip_prefix(tensors, f"model.layers.{global_index}.")
            local_index = global_index - self.start
            self._fill_layer(local_index, global_index, layer_tensors)
            if self.quant != "none":
                weight_quant.quantize_layer(self.layers[local_index], self.quant, self.dtype, self.device)
                # the norms would otherwise keep the block's whole memory-mapped file resident
                weight_quant.own_storage(self.layers[local_index])
            if shard is not None:  # after quantizing: the hooks go on the modules that will run
                all_reduce_after_row_parallel(self.layers[local_index], shard, all_reduce)

    def weight_bytes_per_block(self) -> int:
        """Bytes one block's weights take here (the mean over the stack), quantized or not."""
        return weight_quant.weight_bytes(self.layers) // max(len(self.layers), 1)

    def _fill_layer(self, local_index: int, global_index: int, tensors: dict[str, torch.Tensor]) -> None:
        layer = self.layers[local_index]
        expected = set(layer.state_dict().keys())
        missing = expected - tensors.keys()
        if missing:
            raise CheckpointError(f"checkpoint lacks {sorted(missing)} for block {global_index}")
        layer.load_state_dict({k: tensors[k].to(self.device) for k in expected}, assign=True, strict=True)

    @property
    def tp(self) -> int:
        """Tensor-parallel degree: how many ranks share each layer."""
        return self.shard.tp if self.shard is not None else 1

    def new_cache(self, session_id: str) -> DynamicCache:
        """A session's KV cache over this stack (sharded by KV heads on a tensor-parallel rank)."""
        return DynamicCache(config=self.config)

    def release(self, session_id: str) -> None:
        """Nothing to do: a one-process stack's caches are freed with their sessions.
        (A tensor-parallel group's leader tells its other ranks here; see peer/tp/blocks.py.)"""

    @torch.inference_mode()
    def forward(
        self, hidden: torch.Tensor, cache: DynamicCache, position: int, start: int, end: int
    ) -> torch.Tensor:
        """Runs new tokens through global blocks [start, end) (inside this stack's range),
        appending their keys/values to `cache`.

        hidden: (batch, new_tokens, hidden_size) in self.dtype; position: tokens already cached.
        """
        first, last = start - self.start, end - self.start
        rewind(cache, position)
        new_tokens = hidden.shape[1]
        position_ids = torch.arange(position, position + new_tokens, device=self.device).unsqueeze(0)
        masks = self._masks(hidden, cache, position_ids, first, last)
        positions = architectures.position_embeddings(
            self.rotary_emb, hidden, position_ids, self.layer_types[first:last]
        )
        cache_kwarg = architectures.cache_argument(type(self.layers[first]).forward)
        for i in range(first, last):
            hidden = self.layers[i](
                hidden,
                attention_mask=masks[i - first],
                position_ids=position_ids,
                use_cache=True,
                position_embeddings=positions[i - first],
                **{cache_kwarg: cache},
            )
        return hidden

    @property
    def moves_kv(self) -> bool:
        """Whether a session's keys and values can be sent to or taken from another peer
        (disaggregated prefill and decode): whole layers here, all of full attention."""
        layer_types = set(getattr(self.config, "layer_types", None) or ["full_attention"])
        return (
            self.shard is None
            and layer_types == {"full_attention"}
            and not getattr(self.config, "sliding_window", None)
        )

    @property
    def rolls_back(self) -> bool:
        """Whether a session's cache can drop its last tokens (a step that starts below the
        session's length, after the client rejected drafted tokens): full attention only, since a
        sliding window has already forgotten what a roll-back would need."""
        layer_types = set(getattr(self.config, "layer_types", None) or ["full_attention"])
        return layer_types == {"full_attention"} and not getattr(self.config, "sliding_window", None)

    @property
    def supports_batching(self) -> bool:
        """Whether decode steps of several sessions may run as one batch (see forward_batch)."""
        layer_types = set(getattr(self.config, "layer_types", None) or ["full_attention"])
        return (
            self.spec.model_type in _BATCHABLE
            and layer_types == {"full_attention"}
            and getattr(self.config, "sliding_window", None) is None
        )

    def forward_batch(
        self,
        hiddens: list[torch.Tensor],
        caches: list[DynamicCache],
        positions: list[int],
        start: int,
        end: int,
    ) -> list[torch.Tensor]:
        """One decode token of each session through global blocks [start, end), as one batch.

        hiddens[i]: (batch_i, 1, hidden_size), at positions[i] of caches[i]. Only when
        `supports_batching`; each output equals forward() of that session alone (float tolerance).
        """
        for cache, position in zip(caches, positions, strict=True):
            rewind(cache, position)
        return decode_batch(
            self.layers, self.rotary_emb, hiddens, caches, positions, start - self.start, end - self.start
        )

    def _masks(
        self, hidden: torch.Tensor, cache: DynamicCache, position_ids: torch.Tensor, first: int, last: int
    ):
        """The attention mask of each layer in [first, last), made the way the full model makes them.

        Masks are sized against the first cache layer of their kind that this session runs
        (`layer_idx`): a hop over part of the stack leaves the other layers' caches empty.
        """
        kwargs = dict(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=None,
            position_ids=position_ids,
        )
        kwargs[architectures.cache_argument(create_causal_mask)] = cache
        layer_types = self.layer_types[first:last]
        makers = {
            "full_attention": create_causal_mask,
            "sliding_attention": create_sliding_window_causal_mask,
        }
        by_type = {
            kind: makers[kind](**kwargs, layer_idx=first + layer_types.index(kind))
            for kind in set(layer_types)
        }
        return [by_type[kind] for kind in layer_types]


def rewind(cache: DynamicCache, position: int) -> None:
    """Forgets what `cache` holds past `position` tokens. A step that starts below what the
    session has cached rolls back the tokens after it: drafted tokens its client rejected
    (speculative steps, docs/speculation.md). Only where `rolls_back` (PeerCore checks)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False):
            extra = layer.get_seq_length() - position
            if extra > 0:
                layer.crop(-extra)
