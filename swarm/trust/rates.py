"""Rates per key (a remote peer id, an IP group) for what strangers may ask of a node."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

MAX_KEYS = 4096  # keys remembered; the longest idle are forgotten first


@dataclass
class KeyedRate:
    """A token bucket per key: `per_minute` requests a minute each, bursts of up to two
    minutes' worth (at least one request). A request may cost more than one (`cost`: the
    tokens of a re-check); one costing more than a whole burst is never allowed."""

    per_minute: float
    buckets: OrderedDict = field(default_factory=OrderedDict)  # key -> (tokens, last refill)

    def allows(self, key: str, now: float, cost: float = 1.0) -> bool:
        """Whether `key` may make one more request at `now`, counting nothing (check several
        buckets with this, then `take` from each: a refusal by one costs the others nothing)."""
        return self._level(key, now) >= cost

    def take(self, key: str, now: float, cost: float = 1.0) -> bool:
        """Whether `key` may make one more request at `now` (it is counted if so)."""
        tokens = self._level(key, now)
        self.buckets.pop(key, None)  # re-inserted last: the most recently used
        allowed = tokens >= cost
        self.buckets[key] = (tokens - cost if allowed else tokens, now)
        while len(self.buckets) > MAX_KEYS:
            self.buckets.popitem(last=False)
        return allowed

    def _level(self, key: str, now: float) -> float:
        """The tokens `key` has at `now`: a full burst for a new key, refilled since its last use."""
        burst = max(1.0, 2 * self.per_minute)
        tokens, last = self.buckets.get(key, (burst, now))
        return min(burst, tokens + (now - last) * self.per_minute / 60)
