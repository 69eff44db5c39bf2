"""Reading the DHT from synchronous code (the client, `hexswarm status`, the monitor) with a deadline.

hivemind's `dht.get(key)` waits for its answer without a time limit. The DHT node runs in a
child process and searches the swarm; a node that is stuck (a stopped or overloaded process,
peers that accept a connection and never answer) leaves the caller blocked for good, and with
it the command a user is waiting on. Every synchronous read goes through `get_latest`, which
waits at most `timeout` seconds and reads a late answer as no entries, saying so in the log.
"""

from __future__ import annotations

import logging
from concurrent.futures import CancelledError
from typing import Any

logger = logging.getLogger(__name__)

DHT_READ_TIMEOUT_S = 10.0  # a healthy swarm answers in well under a second; a public one in a few


def get_latest(dht, key: str, timeout: float | None = None) -> Any:
    """The latest value of `key` (hivemind's ValueWithExpiration), or None if the DHT has none,
    fails, or does not answer within `timeout` seconds (default DHT_READ_TIMEOUT_S)."""
    timeout = DHT_READ_TIMEOUT_S if timeout is None else timeout
    try:
        future = dht.get(key, latest=True, return_future=True)
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
