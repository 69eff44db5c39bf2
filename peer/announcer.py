"""Keeps this peer's record in the DHT fresh, signed with its identity."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hivemind.utils import get_dht_time

from hexswarm.swarm.net.identity import Identity
from hexswarm.swarm.net.replicas import store_own
from hexswarm.swarm.trust.record_keys import IndexSchedule, index_key, record_key
from hexswarm.swarm.trust.records import ModelEntry, PeerRecord, PeerState

logger = logging.getLogger(__name__)

STORE_TIMEOUT_S = 10.0
WARN_AFTER_UNSTORED = 3  # announcements in a row reaching no DHT node before it is a warning


class Announcer:
    """Stores `make_record(state)` under this peer's protected subkey every `period` seconds, on
    the nodes nearest the key (swarm/net/replicas.py: found without pulling the key's value).

    Records live for `ttl_periods` periods, so a peer that vanishes without a word drops out
    of the swarm within that time. hivemind keeps whichever value expires last, so a record
    that must replace the current one (e.g. "leaving") never expires earlier than it. The models
    entry goes with every INDEX_PERIODS-th record, and lives INDEX_PERIODS - 1 periods longer.
    """

    def __init__(
        self,
        dht,
        identity: Identity,
        make_record: Callable[[PeerState], PeerRecord],
        num_blocks: int,
        period: float,
        ttl_periods: float = 2.5,
        encode: Callable[[PeerRecord], bytes] = PeerRecord.to_bytes,
    ):
        self.dht = dht
        self.identity = identity
        self.make_record = make_record
        self.num_blocks = num_blocks
        self.period = period
        self.ttl = period * ttl_periods
        self.last_expiration = 0.0
        self.encode = encode  # tests swap in a tampering one (peer/debug.py)
        self.unstored = 0  # announcements in a row that reached no DHT node
        self.index = IndexSchedule()  # which announcements carry the models entry

    async def announce(
        self, state: PeerState, ttl: float | None = None, timeout: float = STORE_TIMEOUT_S
    ) -> None:
        """Stores the record (and the models entry when due) at once; gives up after `timeout` s
        (a leaving peer must not wait on a dead DHT)."""
        record = self.make_record(state)
        expiration = max(get_dht_time() + (self.ttl if ttl is None else ttl), self.last_expiration + 1e-3)
        self.last_expiration = expiration
        subkey, peer_id = self.identity.owner_marker, self.identity.peer_id.to_base58()
        stores = [self._store(record_key(record.model_id, peer_id), self.encode(record), expiration, subkey)]
        if self.index.due():
            entry = ModelEntry(record.model_id, self.num_blocks).to_bytes()
            lasts = self.index.expiration(expiration, self.period)
            stores.append(self._store(index_key(peer_id), entry, lasts, subkey))
        try:
            stored, *index_stored = await asyncio.wait_for(asyncio.gather(*stores), timeout)
        except (TimeoutError, RuntimeError, OSError) as e:  # a dead DHT process must not hang the peer
            logger.warning("announcing %s (%s) failed: %s", record.model_id, state.value, type(e).__name__)
            return
        if any(index_stored):
            self.index.taken()
        self.unstored = 0 if stored else self.unstored + 1
        if not stored:
            # Routine while this DHT node reconnects (a range move, a neighbour restarting): a
            # warning only when it keeps happening.
            log = logger.warning if self.unstored >= WARN_AFTER_UNSTORED else logger.info
            log(
                "announcing %s (%s) reached no DHT node (%d time(s) in a row); will retry",
                record.model_id,
                state.value,
                self.unstored,
            )

    async def _store(self, key: str, value: bytes, expiration: float, subkey: bytes) -> bool:
        return await store_own(self.dht, key, subkey, value, expiration) > 0
