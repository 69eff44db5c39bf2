"""The open-files limit of a process that serves strangers' connections.

A relay holds two sockets per relayed connection and a peer one per stream and tunnel, so the
usual soft limit (1,024 on many Linux systems) runs out long before the relays' own limits do,
and a flood of connections would then fail everyone's. A process raises its soft limit to the
hard one at start; the hard limit is the operator's to set (`ulimit -Hn`)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

LOW = 4096  # below this, an operator should know


def raise_open_files_limit() -> int:
    """Raises the soft RLIMIT_NOFILE to the hard one; returns the limit now in force (0 where the
    platform has none)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as e:
            logger.debug("raising the open-files limit: %s", e)
    if soft < LOW:
        logger.warning("only %d open files allowed (ulimit -n): a relay or a busy peer may run out", soft)
    return soft
