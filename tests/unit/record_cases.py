"""A well-formed PeerRecord for tests, with any field overridden."""

from hexswarm.swarm.trust.records import PeerRecord, PeerState


def make_record(**overrides) -> PeerRecord:
    fields = dict(
        peer_id="Qm123",
        name="p",
        model_id="m-1",
        start=0,
        end=4,
        state=PeerState.ONLINE,
        throughput=100.0,
        decode_ms_per_block=1.5,
        cache_tokens_left=1000,
        open_sessions=0,
        max_length=2048,
        dtype="float32",
        device="cpu",
        version="0.1.0",
        addrs=("/ip4/1.2.3.4",),
    )
    return PeerRecord(**{**fields, **overrides})
