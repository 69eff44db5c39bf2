"""Where peers' announcements live in the DHT: keys spread by the announcing peer's id.

    hexswarm/v1/models/<model_id>/<shard>   subkey [owner:<key>]  ->  msgpack PeerRecord
    hexswarm/v1/model-index/<shard>         subkey [owner:<key>]  ->  msgpack ModelEntry

`shard` is `record_shard(peer_id)`, one of RECORD_SHARDS, fixed by the peer's id: a peer
always writes the same key, and a reader of the whole model reads every shard's key in one
search (swarm/net/dht_read.py `get_many_latest`). One key per model held every record: at 300
peers its value was ~490 KB, each read of it moved that much from every replica, and past
~2,500 peers it would not fit p2pd's 4 MiB message at all. Spread over 32 keys, which hivemind
places on 32 different groups of nodes, a key holds N/32 records: ~16 KB at 300 peers, ~55 KB
at 1,000 (records of ~1.7 KB, owner marker and signature included). A reader that needs only
some peers (a client's sample of candidates) reads some shards, each a random sample of the
swarm. docs/architecture.md, "The control plane's costs".

An entry found under a shard that is not its signer's is dropped: a peer cannot copy its
record into every key to crowd others' reads.

No hivemind here: an edge peer (peer/edge/) builds its keys in a process without it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

MODELS_KEY = "hexswarm/v1/models"  # a model's records: f"{MODELS_KEY}/<model id>/<shard>"
MODEL_INDEX_KEY = "hexswarm/v1/model-index"  # which models are served: f"{MODEL_INDEX_KEY}/<shard>"
RECORD_SHARDS = 32
# The models entry ("this peer serves model m") changes only when the peer does: it is stored at
# every INDEX_PERIODS-th announcement, to last that much longer, not every period beside the
# record (it was half of a peer's stores; a model whose last peer left stays listed, with no
# peers, for at most that much longer).
INDEX_PERIODS = 4


@dataclass
class IndexSchedule:
    """When a peer's announcement carries its models entry (`run-peer`'s and an edge peer's)."""

    announced: int = 0  # announcements made
    due_at: int = 0  # ... when the models entry goes next (again at once if no node took it)

    def due(self) -> bool:
        """Whether this announcement carries the entry (counts the announcement)."""
        self.announced += 1
        return self.announced - 1 >= self.due_at

    def taken(self) -> None:
        """The entry this announcement carried was stored: the next goes INDEX_PERIODS later."""
        self.due_at = self.announced - 1 + INDEX_PERIODS

    @staticmethod
    def expiration(record_expiration: float, period: float) -> float:
        """When the entry expires: INDEX_PERIODS - 1 periods after the record it goes with."""
        return record_expiration + (INDEX_PERIODS - 1) * period


def record_shard(peer_id: str) -> int:
    """The shard of `peer_id`'s entries: uniform over RECORD_SHARDS, fixed by the id."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "big") % RECORD_SHARDS


def record_key(model_id: str, peer_id: str) -> str:
    """The key `peer_id` announces its record of `model_id` under."""
    return f"{MODELS_KEY}/{model_id}/{record_shard(peer_id)}"


def record_keys(model_id: str, shards: range | list[int] | None = None) -> list[str]:
    """The keys of `model_id`'s records: every shard's, or those of `shards`."""
    return [
        f"{MODELS_KEY}/{model_id}/{shard}" for shard in (range(RECORD_SHARDS) if shards is None else shards)
    ]


def index_key(peer_id: str) -> str:
    """The key `peer_id` announces which model it serves under."""
    return f"{MODEL_INDEX_KEY}/{record_shard(peer_id)}"


def index_keys() -> list[str]:
    return [f"{MODEL_INDEX_KEY}/{shard}" for shard in range(RECORD_SHARDS)]


def shard_of_key(key: str) -> int | None:
    """The shard a record or index key names, None for any other key."""
    prefix, _, shard = key.rpartition("/")
    if not shard.isdigit() or not (prefix == MODEL_INDEX_KEY or prefix.startswith(MODELS_KEY + "/")):
        return None
    return int(shard) if int(shard) < RECORD_SHARDS else None


def model_of_key(key: str) -> str | None:
    """The model id a record key names, None for any other key."""
    if shard_of_key(key) is None or not key.startswith(MODELS_KEY + "/"):
        return None
    model_id = key[len(MODELS_KEY) + 1 :].rpartition("/")[0]
    return model_id if model_id and "/" not in model_id else None
