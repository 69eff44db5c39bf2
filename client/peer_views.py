"""What a chain router reads of a peer's signed record (routing.chains.swarm_view.PeerView).

Its own module so that the fields a router sees are listed in one place, the batched decode
figures among them (peers batch decode steps, peer/scheduler.py): a router that missed them would cost a batching peer's open
sessions as if it ran them one at a time.
"""

from __future__ import annotations

from hexswarm.routing.chains.swarm_view import PeerView
from hexswarm.swarm.records import PeerRecord


def peer_view(record: PeerRecord) -> PeerView:
    """The routing view of one (already validated) record."""
    return PeerView(
        peer_id=record.peer_id,
        start=record.start,
        end=record.end,
        throughput=record.throughput,
        decode_ms_per_block=record.decode_ms_per_block,
        cache_tokens_left=record.cache_tokens_left,
        open_sessions=record.open_sessions,
        decode_batch_size=record.decode_batch_size,
        decode_batch_tokens_per_s=record.decode_batch_tokens_per_s,
    )
