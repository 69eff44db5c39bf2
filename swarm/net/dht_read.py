"""Reading the DHT from synchronous code (the client, `hexswarm status`, the monitor) with a deadline.

hivemind's `dht.get(key)` waits for its answer without a time limit. The DHT node runs in a
child process and searches the swarm; a node that is stuck (a stopped or overloaded process,
peers that accept a connection and never answer) leaves the caller blocked for good, and with
it the command a user is waiting on. Every synchronous read goes through `get_latest`, which
waits at most `timeout` seconds and reads a late answer as no entries, saying so in the log;
`dht_get` does the same on an event loop.

How far a read searches (`every_node`): hivemind's `latest=True` keeps searching while any
node of its beam (20, its bucket size) is unasked, and each node asked sends the key's whole
value back; the read keeps the value that expires last. Keys whose entries each writer stores
on the nodes nearest the key every period (a model's peer records, the models key, a
coordinator's lease and plan: swarm/net/replicas.py, hivemind's store) are read with a beam of
NEAR_BEAM instead, hivemind's `num_replicas`: the nodes that hold them, and a few on the way,
answer. Reads that stop at the first value found would cost less, but a node's own storage
answers them first, and a node that joined a moment ago holds only the entries stored since:
they missed records (a full test run showed it). docs/architecture.md, "The control plane's
costs".
"""

from __future__ import annotations

import logging
from concurrent.futures import CancelledError
from typing import Any

logger = logging.getLogger(__name__)

DHT_READ_TIMEOUT_S = 10.0  # a healthy swarm answers in well under a second; a public one in a few
NEAR_BEAM = 5  # nodes kept in a near read's search: hivemind's num_replicas, the nodes a key is stored on


def get_latest(dht, key: str, timeout: float | None = None, every_node: bool = True) -> Any:
    """The latest value of `key` (hivemind's ValueWithExpiration), or None if the DHT has none,
    fails, or does not answer within `timeout` seconds (default DHT_READ_TIMEOUT_S).
    `every_node` False asks the nodes nearest the key only (the module's docstring says when)."""
    timeout = DHT_READ_TIMEOUT_S if timeout is None else timeout
    try:
        future = dht.get(key, return_future=True, **_search(every_node))
    except (OSError, EOFError, ValueError) as e:  # the pipe to a DHT process that is gone
        logger.warning("could not ask the DHT for %s (%s); reading it as no entries", key, type(e).__name__)
        return None
    try:
        return future.result(timeout=timeout)
    except TimeoutError:
        future.cancel()  # the answer, if it ever comes, is dropped
        logger.warning("the DHT did not answer for %s within %.1f s; reading it as no entries", key, timeout)
    except (CancelledError, RuntimeError, OSError, EOFError) as e:
        logger.warning("reading %s from the DHT failed (%s); reading it as no entries", key, type(e).__name__)
    return None


async def dht_get(dht, key: str, timeout: float = DHT_READ_TIMEOUT_S, every_node: bool = True) -> Any:
    """`get_latest` awaited on an event loop (DHT calls stay on one thread), None on failure."""
    import asyncio

    try:
        future = dht.get(key, return_future=True, **_search(every_node))
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except (TimeoutError, RuntimeError, OSError) as e:
        logger.warning("reading %s from the DHT failed: %s", key, type(e).__name__)
        return None


def _search(every_node: bool) -> dict:
    """hivemind's `get` arguments for a read of every node it finds, or of the nearest only."""
    return dict(latest=True) if every_node else dict(latest=True, beam_size=NEAR_BEAM)
