"""The hidden states each hop of a session has been sent, kept so a failed hop can be replayed.

Exact failover needs, for the blocks [s, e) of a failed hop, every input that hop has seen:
its replacement peers run them as one prefill, which rebuilds their KV cache. Those inputs
are the hidden states at block boundary s, one per token, so keeping them costs

    bytes = batch x tokens x hidden_size x dtype bytes, per kept boundary

(e.g. Llama-2-70B, 8192 hidden, float16, 2048 tokens: 32 MiB per boundary and sequence; the
tiny test model: 128 x 4 B = 512 B per token and boundary). A session keeps boundary 0 (its
own input, the embeddings) and as many other hop boundaries as `max_bytes` allows for a full
session (`max_length` tokens). A failed hop whose start boundary is not kept is repaired
from the nearest kept boundary before it: the hops in between are replaced too, which costs
more compute but no more memory. A boundary that starts being kept after the session's first
step has not seen the earlier tokens: it is *incomplete*, and no repair starts there until a
replay gives it everything (`replace`).
"""

from __future__ import annotations

import torch


class InputHistory:
    """block boundary -> the hidden states (batch, tokens, hidden) sent there so far."""

    def __init__(self, bytes_per_boundary: int, max_bytes: int):
        self.bytes_per_boundary = max(1, bytes_per_boundary)  # at the session's full length
        self.max_boundaries = max(1, max_bytes // self.bytes_per_boundary)
        self._chunks: dict[int, list[torch.Tensor]] = {0: []}
        self._incomplete: set[int] = set()  # kept, but only since after the first step

    @property
    def kept(self) -> list[int]:
        return sorted(self._chunks)

    def keep(self, starts: list[int]) -> None:
        """Keeps boundary 0 and the first of `starts` (hop starts of the current route) that fit;
        forgets boundaries no hop starts at any more."""
        wanted = [0] + [s for s in sorted(starts) if s != 0][: self.max_boundaries - 1]
        started = bool(self._chunks[0])
        new = {s for s in wanted if s not in self._chunks}
        self._chunks = {s: self._chunks.get(s, []) for s in wanted}
        self._incomplete = {s for s in wanted if s in self._incomplete or (s in new and started)}

    def append(self, inputs: dict[int, torch.Tensor]) -> None:
        """Adds one step's inputs (boundary -> (batch, new_tokens, hidden)) at the kept boundaries."""
        for start, chunks in self._chunks.items():
            chunks.append(inputs[start])

    def drop_last(self, tokens: int) -> None:
        """Forgets the last `tokens` each boundary was sent: drafted tokens the client rejected
        (a roll-back, docs/speculation.md), which no replay may feed a new peer."""
        for start in self._chunks:
            kept = self.inputs(start)
            if kept is not None:
                self._chunks[start] = [kept[:, : max(0, kept.shape[1] - tokens)]]

    def replace(self, start: int, full: torch.Tensor) -> None:
        """Sets what boundary `start` has seen to `full` (from a replay), if it is kept."""
        if start in self._chunks:
            self._chunks[start] = [full]
            self._incomplete.discard(start)

    def replay_start(self, start: int) -> int:
        """The nearest kept boundary at or before `start`: where a repair of a hop at `start` begins."""
        return max(s for s in self._chunks if s <= start and s not in self._incomplete)

    def inputs(self, start: int) -> torch.Tensor | None:
        """(batch, tokens so far, hidden) sent at boundary `start`, or None before the first step."""
        chunks = self._chunks[start]
        if not chunks:
            return None
        if len(chunks) > 1:  # concatenate once, so a long session does not hold thousands of pieces
            self._chunks[start] = [torch.cat(chunks, dim=1)]
        return self._chunks[start][0]

    def sent_before(self, start: int, position: int, like: torch.Tensor) -> torch.Tensor | None:
        """(batch, position, hidden): everything boundary `start` was sent before `position`
        (empty like `like` at 0); None when the boundary is not kept whole, so it cannot be replayed."""
        if start not in self._chunks or start in self._incomplete:
            return None
        past = self.inputs(start)
        past = like[:, :0] if past is None else past
        return past if past.shape[1] == position else None

    def sent_whole(self, start: int) -> torch.Tensor | None:
        """Everything boundary `start` was sent; None when it is not kept whole or saw nothing."""
        if start not in self._chunks or start in self._incomplete:
            return None
        return self.inputs(start)

    @property
    def nbytes(self) -> int:
        return sum(c.numel() * c.element_size() for chunks in self._chunks.values() for c in chunks)
