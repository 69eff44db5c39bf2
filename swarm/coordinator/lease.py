"""Holding the coordinator lease of one model in the DHT (the record and rule: `records.py`).

A candidate runs `step()` every `period` seconds:

1. it reads the live claims and picks the holder (earliest claim wins);
2. with no holder, or when it is the holder, it writes (renews) its own claim, which expires
   `ttl` seconds later unless renewed;
3. it acts as coordinator only when a read already shows its claim as the holder, never on
   the step that first wrote it: two candidates that claimed at once both read both claims
   on their next step and agree on one winner before either publishes anything.

Bound: a holder that vanishes at time t has a claim that expires by t + ttl; a candidate
writes its own claim at its next step and confirms it one step later, so another candidate
coordinates by t + ttl + 2 x period (plus DHT propagation, well under a second on a LAN). A
holder that stops cleanly (SIGTERM, Ctrl-C) releases its claim first (`release`), which cuts
this to 2 x period.
"""

from __future__ import annotations

import asyncio
import logging

from hivemind.utils import get_dht_time

from hexswarm.swarm.coordinator.records import Lease, Trust, current_holder, lease_key, read_leases
from hexswarm.swarm.net.identity import Identity

logger = logging.getLogger(__name__)

STORE_TIMEOUT_S = 10.0


class LeaseKeeper:
    """One candidate's side of the lease."""

    def __init__(
        self, dht, identity: Identity, model_id: str, ttl: float, period: float, trust: Trust = None
    ):
        if ttl <= period:
            raise ValueError("the lease ttl must be longer than the renewal period")
        self.dht, self.identity, self.model_id = dht, identity, model_id
        self.ttl, self.period = ttl, period
        self.me = identity.peer_id.to_base58()
        # It competes with the trusted candidates only, and trusts itself.
        self.trust = trust if trust is None else trust | {self.me}
        self.since: float | None = None  # when our current claim was first written
        self.holding = False
        self.standing_by: str | None = None  # the holder this candidate last logged it stands by for

    async def step(self) -> bool:
        """Reads, claims or renews; returns whether this candidate holds the lease now."""
        leases = await read_leases(self.dht, self.model_id, self.trust)
        holder = current_holder(leases, self.model_id)
        holding = holder is not None and holder.holder == self.me and self.since is not None
        if holder is not None and not holding:
            if self.standing_by != holder.holder:  # once per holder
                logger.info(
                    "coordinator lease of %s is held by %s: standing by", self.model_id, holder.holder[-8:]
                )
                self.standing_by = holder.holder
            self.since = None
        else:
            self.since = self.since if self.since is not None else get_dht_time()
            await self._store(Lease(self.model_id, self.me, self.since))
        if holding and not self.holding:
            logger.info("took the coordinator lease of %s", self.model_id)
            self.standing_by = None
        self.holding = holding
        return holding

    async def release(self) -> None:
        """On a clean stop: replaces our claim by a released one, so a standby candidate takes
        over at its next step or two instead of after the claim expires (`ttl`). The DHT keeps
        the entry that expires last, so the release outlives the claim it replaces."""
        if self.since is None:
            return
        await self._store(Lease(self.model_id, self.me, self.since, released=True), extra_s=1.0)
        self.since, self.holding = None, False
        logger.info("released the coordinator lease of %s", self.model_id)

    async def _store(self, lease: Lease, extra_s: float = 0.0) -> None:
        future = self.dht.store(
            lease_key(self.model_id),
            lease.to_bytes(),
            get_dht_time() + self.ttl + extra_s,
            subkey=self.identity.owner_marker,
            return_future=True,
        )
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), STORE_TIMEOUT_S)
        except (TimeoutError, RuntimeError, OSError) as e:
            logger.warning("renewing the coordinator lease failed: %s", type(e).__name__)
