"""The model's records as a reader follows them every period: a few of the record shards
(swarm/trust/record_keys.py) read fresh, the others as last read. Serving peers read them so
each announce period (peer/runtime.py), the coordinator each watch period (swarm/coordinator/).

Each period a peer needs the swarm's records for its link probes, its relay and dial-back
choices, the members it may push to and, for an auto peer, Petals' rule. Read whole every
period, they were each peer's largest cost, growing as N (docs/architecture.md, "The control
plane's costs"). A window of `per_period` shards a period, in turn, sees every shard within
RECORD_SHARDS / per_period periods: SHARDS_PER_PERIOD (2) for a peer, a turn of 16 periods (4
minutes at the default 15 s; a key read costs ~15 kB of search replies at 24 nodes, so 8 keys a
period were most of a peer's upkeep), and more for the coordinator, which must see a leave
within seconds. The first read is whole, so a reader that just started sees the swarm at once;
later ones never are, even after failures: on a swarm too loaded to answer, whole reads every
period would load it more (100 stand-ins on two cores did so, benchmarks/scale.py). A failed
read changes nothing held; a shard not read in the last two turns of reads is dropped, not
trusted. Age is counted in reads, not seconds: a coordinator whose step waited on a long search
must not find its whole view expired. A record leaves the view when a read finds its peer GONE,
or when two reads of its shard in a row do not find it: one read can miss a record (the replica
that answered lacked it), and a peer absent for a whole turn of the window (8 s for the
coordinator) would look to it like a leave and cost a re-plan.
What must be current reads fresh instead: a range move's coverage check, an unknown push target.

A peer's window also reads about RECORDS_PER_PERIOD records a period, not more: a shard costs
the records it held at its last read (each of them comes from the ~5 nodes that store the key),
and the window reads the next shard once the records it may read, accrued a period at a time,
cover it. Up to ~128 peers (4 records a shard) the bound changes nothing; past it, a peer's
reads stay ~8 records a period however large the swarm, and its view of the whole swarm turns
over in N / RECORDS_PER_PERIOD periods (~9 min at 300 peers) instead of 16. What a peer does
with the records (its probes, dial-back and relay choices, rejoin contacts, Petals' rule) needs
a recent sample of the swarm, not every change of it. The coordinator's window has no bound.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from hexswarm.swarm.trust.record_keys import RECORD_SHARDS, shard_of_key
from hexswarm.swarm.trust.records import PeerRecord, PeerState, peer_records_from, records_values

SHARDS_PER_PERIOD = 2  # a serving peer's window: at most 2 shards a period,
RECORDS_PER_PERIOD = 8  # ... of about 8 records a period in all (the module's docstring)


@dataclass
class RecordWindow:
    """`read(shards=...)` gives {record key: DHT value} of those shards, {} when the read failed
    (swarm/trust/records.py `records_values`)."""

    model_id: str
    read: Callable[[list[int]], Awaitable[dict]]
    per_period: int = SHARDS_PER_PERIOD
    records_per_read: int | None = RECORDS_PER_PERIOD  # None: no bound (the coordinator's)
    # shard -> (at read, records found, records found the read before but not this one)
    held: dict[int, tuple[int, list[PeerRecord], list[PeerRecord]]] = field(default_factory=dict)
    reads: int = 0
    next_shard: int = 0
    credit: float = 0.0  # records the window may still read (accrued records_per_read a read)

    async def records(self) -> list[PeerRecord]:
        """Every record held, after this period's window is read."""
        shards = self._window()
        values = await self.read(shards=shards) if shards else {}
        self.reads += 1
        for key, value in values.items():
            shard = shard_of_key(key)
            if shard is not None:
                self._renew(shard, peer_records_from({key: value}, self.model_id, keep_gone=True))
        oldest = self.reads - self.max_age_reads
        self.held = {shard: held for shard, held in self.held.items() if held[0] > oldest}
        return [
            record
            for _, found, missed_once in self.held.values()
            for record in found + missed_once
            if record.state != PeerState.GONE
        ]

    def _renew(self, shard: int, found: list[PeerRecord]) -> None:
        """The shard as just read; a record found the read before and not now is kept once more."""
        ids = {record.peer_id for record in found}
        _, before, _ = self.held.get(shard, (0, [], []))
        self.held[shard] = (self.reads, found, [record for record in before if record.peer_id not in ids])

    @property
    def max_age_reads(self) -> int:
        """Reads after which a shard not read again is dropped: two turns of the window."""
        turn = RECORD_SHARDS / self.per_period
        if self.records_per_read is not None:
            turn = max(turn, sum(map(self._cost, range(RECORD_SHARDS))) / self.records_per_read)
        return 2 * math.ceil(turn)

    def _cost(self, shard: int) -> int:
        """What reading `shard` costs, in records: as many as it held at its last read (at least 1)."""
        _, found, missed_once = self.held.get(shard, (0, [], []))
        return max(1, len(found) + len(missed_once))

    @classmethod
    def of(
        cls,
        dht,
        model_id: str,
        per_period: int = SHARDS_PER_PERIOD,
        records_per_read: int | None = RECORDS_PER_PERIOD,
    ) -> RecordWindow:
        """The window of `model_id`'s records, read from `dht`, `per_period` shards a read (and
        about `records_per_read` records, unless None)."""
        return cls(model_id, partial(records_values, dht, model_id), per_period, records_per_read)

    def _window(self) -> list[int]:
        if self.reads == 0:  # the first read: the whole swarm at once
            return list(range(RECORD_SHARDS))
        bound = math.inf if self.records_per_read is None else self.records_per_read
        self.credit += bound
        shards = []
        while len(shards) < self.per_period and self._cost(self.next_shard) <= self.credit:
            self.credit -= self._cost(self.next_shard)
            shards.append(self.next_shard)
            self.next_shard = (self.next_shard + 1) % RECORD_SHARDS
        # Reads not taken are not saved up for later periods, beyond what the next shard costs.
        self.credit = min(self.credit, max(bound, self._cost(self.next_shard)))
        return shards
