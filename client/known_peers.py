"""The peers a session knows: their records as last read from the DHT, and their names.

Choosing a chain, dialing a hop, setting its deadline and logging a failure all read the same
records, and a session re-reads them while it waits for peers (a peer may restart or join
meanwhile): one shared holder, so every part sees the same read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hexswarm.client.swarm_client import SwarmClient
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.trust.records import PeerRecord


@dataclass
class KnownPeers:
    """peer id -> its record, as last read; only peers that accept `max_length` tokens."""

    swarm: SwarmClient
    spec: ModelSpec
    max_length: int  # the session's tokens: a peer with a shorter --max-length cannot serve it
    records: dict[str, PeerRecord] = field(default_factory=dict)

    def get(self, peer_id: str) -> PeerRecord | None:
        return self.records.get(peer_id)

    def name(self, peer_id: str) -> str:
        """The peer's announced name, or the end of its id when it has no record."""
        record = self.records.get(peer_id)
        return record.name if record else peer_id[-6:]

    def set(self, records: list[PeerRecord]) -> None:
        self.records = {r.peer_id: r for r in records}

    def refresh(self) -> None:
        """Re-reads the records from the DHT (peers may have joined since the session opened)."""
        fresh = self.swarm.online_records(self.spec.model_id, self.spec.num_blocks)
        self.set([r for r in fresh if r.max_length >= self.max_length])
