"""Spare memory serves blocks a second time, so that one leave uncovers nothing.

HexGen's search (§4.3) sizes each stage for speed and leaves whatever memory a peer has beyond
its stage unused. In a swarm of volunteers that memory is worth more as a second copy: if a
block is served by two peers, either may leave and the block stays served while the
coordinator re-plans, instead of waiting for a move. So after the search each auto peer's range
is widened, within what its memory holds, to reach the blocks served fewer than `COPIES`
times: the fewest-served blocks first, then the smallest widening (each added block is a
load). A widened range still contains the stage the search gave the peer, so every pipeline of
the plan stays as the search built it; clients simply find more routes.

Pure: ranges and capacities in, ranges out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

COPIES = 2  # how many peers should serve each block, where memory allows


def served_counts(spans: Sequence[tuple[int, int]], num_blocks: int) -> list[int]:
    """How many of `spans` serve each block."""
    counts = [0] * num_blocks
    for start, end in spans:
        for block in range(max(0, start), min(end, num_blocks)):
            counts[block] += 1
    return counts


def widen(
    ranges: Mapping[str, tuple[int, int]],
    capacity: Mapping[str, int],
    fixed: Sequence[tuple[int, int]],
    num_blocks: int,
    copies: int = COPIES,
    passes: int = 4,
) -> dict[str, tuple[int, int]]:
    """Each peer's range, widened within `capacity[peer]` blocks toward under-served blocks.

    `ranges`: the auto peers' planned ranges, which each widened range contains; `fixed`: the
    ranges of peers that are never moved (they count as serving). A block few peers can reach
    weighs more than one many can (the model's ends: only peers planned near them reach them).
    Each pass lets every peer, in peer-id order, choose its best range given the others'
    (coordinate descent), until a pass changes nothing.
    """
    out = dict(ranges)
    reach = _reach(ranges, capacity, num_blocks)
    counts = served_counts([*out.values(), *fixed], num_blocks)
    for _ in range(passes):
        changed = False
        for peer in sorted(out):
            start, end = ranges[peer]
            _count(counts, out[peer], -1)
            best = _best_range(start, end, capacity.get(peer, 0), counts, reach, copies, out[peer])
            _count(counts, best, +1)
            changed |= best != out[peer]
            out[peer] = best
        if not changed:
            break
    return out


def _reach(ranges: Mapping[str, tuple[int, int]], capacity: Mapping[str, int], num_blocks: int) -> list[int]:
    """How many peers can serve each block within their capacity, keeping their planned range."""
    reach = [0] * num_blocks
    for peer, (start, end) in ranges.items():
        spare = max(0, capacity.get(peer, 0) - (end - start))
        for block in range(max(0, start - spare), min(num_blocks, end + spare)):
            reach[block] += 1
    return reach


def _count(counts: list[int], span: tuple[int, int], step: int) -> None:
    for block in range(*span):
        counts[block] += step


def _best_range(
    start: int,
    end: int,
    capacity: int,
    counts: list[int],
    reach: list[int],
    copies: int,
    current: tuple[int, int],
) -> tuple[int, int]:
    """The range containing [start, end), at most `capacity` long, that adds the most missing
    copies (weighted by how few peers reach each block), then adds the fewest blocks, then is
    the range held now (no needless move)."""
    spare = capacity - (end - start)
    best, best_key = (start, end), (0.0, 0, False)
    for left in range(0, max(0, min(spare, start)) + 1):
        for right in range(0, max(0, min(spare - left, len(counts) - end)) + 1):
            span = (start - left, end + right)
            gain = sum(max(0, copies - counts[b]) / max(reach[b], 1) for b in range(*span))
            key = (round(gain, 9), -(left + right), span == current)
            if key > best_key:
                best, best_key = span, key
    return best
