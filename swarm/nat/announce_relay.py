"""A full node stores an edge peer's records for it, signatures intact (the edge peer's side is
peer/edge/host.py; why edge peers exist: docs/architecture.md "Edge peers").

An edge peer runs py-libp2p, not hivemind, so it cannot speak hivemind's DHT RPC. It signs each
record with its own key exactly as hivemind's RSASignatureValidator expects (swarm/trust/dht_signing.py)
and sends the signed bytes here, on ANNOUNCE_PROTOCOL. This node checks what every DHT node
would check and more (the signature, that the record names the key's own peer id, a bounded
expiration), then stores the bytes unchanged on the nodes nearest the key. It cannot change them:
the signature covers key, subkey, value and expiration, and every node re-checks it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from hexswarm.swarm.net.identity import peer_id_from_owner_marker
from hexswarm.swarm.trust.dht_signing import (
    MAX_ANNOUNCE_BYTES,
    MAX_RELAYED_TTL_S,
    SignedEntry,
    decode_announce,
    dht_key_id,
    encode_reply,
    hivemind_dumps,
)
from hexswarm.swarm.trust.rates import KeyedRate
from hexswarm.swarm.trust.record_keys import MODEL_INDEX_KEY, index_key, model_of_key, record_key
from hexswarm.swarm.trust.records import ModelEntry, PeerRecord, read_peer_records
from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError
from hexswarm.swarm.wire.frames import read_payload

logger = logging.getLogger(__name__)

MAX_CONCURRENT = 8  # requests being checked and stored at once; more are refused, not queued
MAX_READING_PER_GROUP = 4  # requests of one IP group being read at once (one per remote)
REQUESTS_PER_MINUTE = 12  # per remote: an edge peer announces once a period (15 s by default: 4 a minute)
REQUEST_TIMEOUT_S = 10.0  # to read a request, and to store it
STORE_TIMEOUT_S = 10.0
MEMBERS_TIMEOUT_S = 5.0  # reading the model's records for the reply's member list
MEMBERS_TTL_S = 2.0  # a member list read is reused this long (one DHT read, however many ask)


class AnnounceRelay:
    """Checks and stores signed records that edge peers send on ANNOUNCE_PROTOCOL.

    Each remote sends its own records only, one request at a time, at most REQUESTS_PER_MINUTE;
    an IP group reads at most MAX_READING_PER_GROUP requests at once, and a request takes one of
    the MAX_CONCURRENT slots only once it is read: a remote that trickles its bytes holds up
    itself, not every edge peer's announcements."""

    def __init__(self, dht, identity, group_of=None):
        from hivemind.dht.crypto import RSASignatureValidator

        self.dht = dht
        self.validator = RSASignatureValidator(identity.private_key)
        self.group_of = group_of  # async: remote peer id -> its IP group (None: each remote its own)
        self.busy = 0
        self.reading: dict[str, str] = {}  # remote -> its IP group, while its request is read
        self.rate = KeyedRate(REQUESTS_PER_MINUTE)
        self._members: dict[str, tuple[float, tuple[str, ...]]] = {}  # model id -> (read at, ids)

    async def handle_stream(
        self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One request, one reply, then the stream closes."""
        sender = stream_info.peer_id.to_base58()
        try:
            payload = await self._read(sender, reader)
            if self.busy >= MAX_CONCURRENT:
                raise ProtocolError(ErrorCode.BUSY, f"{MAX_CONCURRENT} announcements are being relayed")
            self.busy += 1
            try:
                entries = decode_announce(payload)
                stored = await self.relay(entries, sender)
                members = await self.members(entries)
            finally:
                self.busy -= 1
            writer.write(encode_reply(stored, members=members))
        except ProtocolError as e:
            logger.info("refused an announcement from ...%s: %s", sender[-8:], e)
            writer.write(encode_reply(0, str(e)))
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _read(self, sender: str, reader: asyncio.StreamReader) -> bytes:
        """The request's bytes, within the sender's and its IP group's shares."""
        if sender in self.reading:
            raise ProtocolError(ErrorCode.BUSY, "one announcement at a time per remote")
        if not self.rate.take(sender, time.monotonic()):
            raise ProtocolError(
                ErrorCode.RATE_LIMITED, f"at most {REQUESTS_PER_MINUTE} announcements a minute"
            )
        group = await self.group_of(sender) if self.group_of is not None else sender
        if sum(g == group for g in self.reading.values()) >= MAX_READING_PER_GROUP:
            raise ProtocolError(ErrorCode.BUSY, f"{MAX_READING_PER_GROUP} announcements from {group} already")
        self.reading[sender] = group
        try:
            return await asyncio.wait_for(read_payload(reader, MAX_ANNOUNCE_BYTES), REQUEST_TIMEOUT_S)
        finally:
            del self.reading[sender]

    async def relay(self, entries: list[SignedEntry], sender: str | None = None) -> int:
        """Checks every entry first (all or none are stored), and that `sender` (the remote, if
        known) is the owner of each; returns how many nodes took them."""
        for entry in entries:
            self.check(entry)
            owner = peer_id_from_owner_marker(entry.subkey).to_base58()
            if sender is not None and owner != sender:
                raise ProtocolError(ErrorCode.MALFORMED, f"...{sender[-8:]} may relay only its own records")
        stored = 0
        for entry in entries:
            future = self.dht.run_coroutine(
                partial(_store_signed, entry.key, entry.subkey, entry.value, entry.expiration),
                return_future=True,
            )
            stored += await asyncio.wait_for(asyncio.wrap_future(future), STORE_TIMEOUT_S)
        return stored

    async def members(self, entries: list[SignedEntry]) -> tuple[str, ...]:
        """The peer ids announcing the model of the relayed record: those the edge peer may push
        to (peer/push.py reads the DHT for it; an edge peer cannot, so its relay does)."""
        models = [model_of_key(e.key) for e in entries if model_of_key(e.key) is not None]
        if not models:
            return ()
        read_at, members = self._members.get(models[0], (float("-inf"), ()))
        if time.monotonic() - read_at > MEMBERS_TTL_S:
            records = await asyncio.to_thread(read_peer_records, self.dht, models[0], MEMBERS_TIMEOUT_S)
            members = tuple(r.peer_id for r in records)
            self._members = {models[0]: (time.monotonic(), members)}  # one model's: bounded
        return members

    def check(self, entry: SignedEntry) -> None:
        """What makes a relayed entry acceptable; ProtocolError says what is wrong."""
        from hivemind.dht.validation import DHTRecord

        if model_of_key(entry.key) is None and not entry.key.startswith(MODEL_INDEX_KEY + "/"):
            raise ProtocolError(ErrorCode.MALFORMED, "only hexswarm model records are relayed")
        if not time.time() < entry.expiration <= time.time() + MAX_RELAYED_TTL_S:
            raise ProtocolError(
                ErrorCode.MALFORMED, f"the expiration must be within {MAX_RELAYED_TTL_S:.0f} s from now"
            )
        try:
            owner = peer_id_from_owner_marker(entry.subkey).to_base58()
        except Exception:
            raise ProtocolError(ErrorCode.MALFORMED, "the subkey is not an [owner:...] marker") from None
        record = DHTRecord(dht_key_id(entry.key), hivemind_dumps(entry.subkey), entry.value, entry.expiration)
        if not self.validator.validate(record):
            raise ProtocolError(ErrorCode.MALFORMED, f"not signed by the key of ...{owner[-8:]}")
        _check_value(entry.key, owner, self.validator.strip_value(record))


def _check_value(key: str, owner: str, value_bytes: bytes) -> None:
    """The signed value must be what its key holds, about its signer."""
    import msgpack

    try:
        raw = msgpack.unpackb(value_bytes, raw=False)
        if key.startswith(MODEL_INDEX_KEY + "/"):
            ModelEntry.from_bytes(raw)
            if key != index_key(owner):
                raise ValueError("a model entry stored under another peer's key")
            return
        record = PeerRecord.from_bytes(raw)
    except Exception as e:
        raise ProtocolError(ErrorCode.MALFORMED, f"the value is no hexswarm record: {e}") from None
    if record.peer_id != owner or record_key(record.model_id, owner) != key:
        raise ProtocolError(ErrorCode.MALFORMED, "the record names another peer or another model's key")


async def _store_signed(key: str, subkey: bytes, value: bytes, expiration: float, _dht, node) -> int:
    """Runs in the DHT process: stores already-signed bytes on the nodes nearest `key`, as
    DHTNode.store does after it signs (which it cannot do here: the key is the edge peer's)."""
    from hivemind.dht.routing import DHTID

    key_id = DHTID.generate(source=key)
    nearest = await node.find_nearest_nodes([key_id], k_nearest=node.num_replicas)
    stored = 0
    for node_id, peer_id in nearest[key_id].items():
        if node_id == node.node_id:
            stored += bool(node.protocol.storage.store(key_id, value, expiration, subkey=subkey))
        else:
            ok = await node.protocol.call_store(peer_id, [key_id], [value], expiration, subkeys=[subkey])
            stored += bool(ok and ok[0])
    return stored
