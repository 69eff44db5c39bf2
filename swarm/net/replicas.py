"""Storing a node's own entries on the nodes nearest each key, without pulling the key's value.

hivemind's `DHT.store` first searches for the nodes nearest the key, and its search asks up to
20 nodes (its bucket size), each of which answers with the key's whole value: hivemind's find
RPC returns what a node holds for the key along with its neighbours. A peer that re-stored its
record every announce period paid for every other peer's record of the model, twenty times
over, each period. `store_own` searches for the id one bit away from the key's instead: its
nearest nodes are the key's (XOR distances to both differ in the last of 160 bits only), but no
node holds a value under it, so the nodes asked answer with their neighbours only. Then it
stores on those nodes directly, signed as hivemind signs (the node's own record validator).

It searches at every store, as hivemind does (with a beam of STORE_BEAM nodes, not its 20): a
node that joined near the key gets each entry at its writer's next store, so no replica is more
than a period behind. (Reusing the nodes found for a minute left new nodes partial replicas for
that minute: in a full test run, readers missed records.)
"""

from __future__ import annotations

import asyncio
from functools import partial

STORE_CALL_S = 5.0  # one replica's store; a replica that hangs must not hold up the others
# Nodes kept in the search for the replicas: the num_replicas (5) it wants, as a near read keeps
# (swarm/net/dht_read.py NEAR_BEAM), so writer and readers look for the same nodes the same way.
# hivemind's default keeps its bucket size (20): at 24 nodes a store's search asked 20 of them
# (43 kB a key), with 5 it asks 5 (24 kB, most of it the 5 stores themselves).
STORE_BEAM = 5


async def store_own(dht, key: str, subkey: bytes, value: bytes, expiration: float) -> int:
    """Stores `value` under `key`/`subkey` until `expiration` on the nodes nearest `key`; returns
    how many of them took it (0: none did, or the DHT's process did not answer)."""
    future = dht.run_coroutine(partial(_store_in_node, key, subkey, value, expiration), return_future=True)
    return await asyncio.wrap_future(future)


async def _store_in_node(key: str, subkey: bytes, value: bytes, expiration: float, _dht, node) -> int:
    """Runs in the DHT's own process (hivemind's DHT.run_coroutine)."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    key_id = DHTID.generate(source=key)
    nearest = await _nearest(node, key_id)
    protocol = node.protocol
    record = DHTRecord(
        key_id.to_bytes(), protocol.serializer.dumps(subkey), protocol.serializer.dumps(value), expiration
    )
    if protocol.record_validator is not None:
        signed = protocol.record_validator.sign_value(record)
        record = DHTRecord(record.key, record.subkey, signed, expiration)
    calls = [
        _store_on(node, node_id, peer_id, key_id, subkey, record) for node_id, peer_id in nearest.items()
    ]
    return sum(await asyncio.gather(*calls))


async def _nearest(node, key_id) -> dict:
    """{node id: peer id} of the nodes nearest `key_id`, nearest first; this node among them
    only if it is a server (a client-mode node is no replica: swarm/net/dht_process.py)."""
    from hivemind.dht.routing import DHTID

    beside = DHTID(int(key_id) ^ 1)  # the same nearest nodes, and no value held under it
    found = await node.find_nearest_nodes(
        [beside], k_nearest=node.num_replicas, beam_size=STORE_BEAM, exclude_self=node.protocol.client_mode
    )
    return found[beside]


async def _store_on(node, node_id, peer_id, key_id, subkey: bytes, record) -> bool:
    if node_id == node.node_id:  # this node is a replica itself
        validator = node.protocol.record_validator
        if validator is not None and not validator.validate(record):
            return False
        return bool(node.protocol.storage.store(key_id, record.value, record.expiration_time, subkey=subkey))
    try:
        done = await asyncio.wait_for(
            node.protocol.call_store(
                peer_id, [key_id], [record.value], [record.expiration_time], subkeys=[subkey]
            ),
            STORE_CALL_S,
        )
    except TimeoutError:
        return False
    return bool(done and done[0])
