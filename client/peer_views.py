"""What a chain router reads of a peer's signed record (routing.chains.swarm_view.PeerView).

Its own module so that the fields a router sees are listed in one place, the batched decode
figures among them (peers batch decode steps, peer/scheduler.py): a router that missed them would cost a batching peer's open
sessions as if it ran them one at a time.
"""

from __future__ import annotations

from hexswarm.client.observed import ObservedSpeeds
from hexswarm.routing.chains.swarm_view import PeerView
from hexswarm.swarm.trust.records import PeerRecord


def peer_view(record: PeerRecord, observed: ObservedSpeeds | None = None) -> PeerView:
    """The routing view of one (already validated) record. With `observed`, a peer announcing
    itself over twice as fast as the client measured it is seen at the measured speed, its
    throughputs scaled down alike (client/observed.py)."""
    decode_ms, scale = record.decode_ms_per_block, 1.0
    if observed is not None:
        decode_ms = observed.effective_ms_per_block(record.peer_id, record.decode_ms_per_block, record.name)
        if decode_ms > record.decode_ms_per_block:
            scale = record.decode_ms_per_block / decode_ms
    return PeerView(
        peer_id=record.peer_id,
        start=record.start,
        end=record.end,
        throughput=record.throughput * scale,
        decode_ms_per_block=decode_ms,
        cache_tokens_left=record.cache_tokens_left,
        open_sessions=record.open_sessions,
        decode_batch_size=record.decode_batch_size,
        decode_batch_tokens_per_s=record.decode_batch_tokens_per_s * scale,
    )
