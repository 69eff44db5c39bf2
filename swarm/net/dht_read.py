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
from collections.abc import Sequence
from concurrent.futures import CancelledError
from functools import partial
from typing import Any

logger = logging.getLogger(__name__)

DHT_READ_TIMEOUT_S = 10.0  # a healthy swarm answers in well under a second; a public one in a few
NEAR_BEAM = 5  # nodes kept in a near read's search: hivemind's num_replicas, the nodes a key is stored on
# Calls in flight at once in a search of many keys (hivemind's default is 4): a model's 32
# record keys took ~55 ms to read with 4 on a test swarm of four nodes, ~38 ms with 8.
MANY_KEYS_WORKERS = 8
ANSWER_MARGIN_S = 1.0  # of a read's time, left for the search's answer to cross the pipe


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


def get_many_latest(dht, keys: Sequence[str], timeout: float | None = None) -> dict[str, Any]:
    """`get_latest(every_node=False)` of each of `keys`, found in one search (hivemind's
    `get_many`: a node asked about several keys answers for all of them in one call): {key:
    value, None where none is found}, or {} if the DHT fails or does not answer within `timeout`
    seconds (an empty key and a failed read differ: a peer's record window keeps what it held)."""
    timeout = DHT_READ_TIMEOUT_S if timeout is None else timeout
    try:
        future = _ask_many(dht, keys, timeout)
    except (OSError, EOFError, ValueError) as e:  # the pipe to a DHT process that is gone
        logger.warning(
            "could not ask the DHT for %s (%s); reading it as no entries", _keys_text(keys), type(e).__name__
        )
        return {}
    try:
        return future.result(timeout=timeout)
    except TimeoutError:  # not cancelled: the search ends by its own deadline, in the DHT's process
        logger.warning(
            "the DHT did not answer for %s within %.1f s; reading it as no entries", _keys_text(keys), timeout
        )
    except (CancelledError, RuntimeError, OSError, EOFError) as e:
        logger.warning(
            "reading %s from the DHT failed (%s); reading it as no entries",
            _keys_text(keys),
            type(e).__name__,
        )
    return {}


async def dht_get_many(dht, keys: Sequence[str], timeout: float = DHT_READ_TIMEOUT_S) -> dict[str, Any]:
    """`get_many_latest` awaited on an event loop."""
    import asyncio

    try:
        future = _ask_many(dht, keys, timeout)
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
    except (TimeoutError, RuntimeError, OSError) as e:
        logger.warning("reading %s from the DHT failed: %s", _keys_text(keys), type(e).__name__)
        return {}


def _ask_many(dht, keys: Sequence[str], timeout: float):
    """The DHT process's future answer to a search of `keys` that ends on its own before `timeout`."""
    return dht.run_coroutine(
        partial(_get_many_near, list(keys), _search_deadline(timeout)), return_future=True
    )


async def _get_many_near(keys: list[str], timeout: float, _dht, node) -> dict[str, Any]:
    """Runs in the DHT's own process (hivemind's DHT.run_coroutine): the latest value of each key
    from the nodes nearest it, {} past `timeout` seconds. The deadline is kept here:
    had the caller cancelled its future instead, hivemind would log a traceback when the search
    ends (its run_coroutine sets the result of the cancelled future: hundreds in a loaded run)."""
    import asyncio

    search = node.get_many(
        keys, sufficient_expiration_time=float("inf"), beam_size=NEAR_BEAM, num_workers=MANY_KEYS_WORKERS
    )
    try:
        found = await asyncio.wait_for(search, timeout)
    except TimeoutError:
        return {}
    return {key: found.get(key) for key in keys}


def _search_deadline(timeout: float) -> float:
    """How long the search itself may take of a read's `timeout`: what is left for its answer
    to reach the caller before the caller stops waiting."""
    return max(timeout - ANSWER_MARGIN_S, timeout / 2)


def _keys_text(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else f"{len(keys)} keys ({keys[0]}, ...)"


def _search(every_node: bool) -> dict:
    """hivemind's `get` arguments for a read of every node it finds, or of the nearest only."""
    return dict(latest=True) if every_node else dict(latest=True, beam_size=NEAR_BEAM)
