"""The dial-back asker's side: asking helpers to dial this node back, and judging their
replies (the protocol: messages.py)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence

from hexswarm.swarm.nat.reachability.messages import (
    ASK_TIMEOUT_S,
    BUSY,
    BUSY_RETRY_S,
    BUSY_TRIES,
    DIALBACK_PROTOCOL,
    MAX_REQUEST_BYTES,
    MAX_SPARES,
    DialBackReply,
    decode_reply,
    encode_request,
)
from hexswarm.swarm.net.maddrs import ip_group, tcp_addr
from hexswarm.swarm.wire.frames import framed, read_payload

logger = logging.getLogger(__name__)


def reachable_verdict(replies: Sequence[DialBackReply | None]) -> bool | None:
    """Direct reachability from helpers' replies: None when no helper answered; otherwise True
    when at least half of those that answered could dial us (a lying helper cannot, alone,
    outvote the bootstrap and another)."""
    answered = [r for r in replies if r is not None and not r.error]
    if not answered:
        return None
    yes = sum(1 for r in answered if r.reached)
    return yes > 0 and 2 * yes >= len(answered)


async def ask(p2p, helper: str, addrs: Sequence[str], timeout: float = ASK_TIMEOUT_S) -> DialBackReply | None:
    """One helper's dial-back of `addrs`; None if it could not be asked or did not answer. A
    BUSY helper is asked again after BUSY_RETRY_S, doubling, BUSY_TRIES times in all: peers
    behind one NAT that start together must not read "busy" as "nobody could check"."""
    from hivemind.p2p import PeerID

    async def exchange() -> DialBackReply:
        _, reader, writer = await p2p.call_binary_stream_handler(
            PeerID.from_base58(helper), DIALBACK_PROTOCOL
        )
        try:
            writer.write(framed(encode_request(addrs)))
            await writer.drain()
            return decode_reply(helper, await read_payload(reader, MAX_REQUEST_BYTES), addrs)
        finally:
            writer.close()

    deadline = time.monotonic() + timeout
    wait = BUSY_RETRY_S
    for tries in range(1, BUSY_TRIES + 1):
        try:
            reply = await asyncio.wait_for(exchange(), max(deadline - time.monotonic(), 0.1))
        except Exception as e:
            logger.debug("dial-back by ...%s: %s: %s", helper[-8:], type(e).__name__, e)
            return None
        if reply.error.startswith(BUSY):  # what benchmarks/scale.py counts as `dialback_busy`
            logger.info("dial-back helper ...%s answered busy (try %d of %d)", helper[-8:], tries, BUSY_TRIES)
        if not reply.error.startswith(BUSY) or tries == BUSY_TRIES or time.monotonic() + wait >= deadline:
            return reply
        await asyncio.sleep(wait * random.uniform(1, 2))
        wait *= 2
    return None


async def ask_many(
    p2p, helpers: Sequence[str], addrs: Sequence[str], spares: Sequence[str] = ()
) -> list[DialBackReply | None]:
    """Asks every helper at once; one that stays busy or does not answer is replaced by the
    next of `spares` (at most MAX_SPARES of them are asked), so that a jammed or gone helper
    costs an answer, not the verdict."""
    queue = list(spares)[:MAX_SPARES]

    async def one(helper: str) -> DialBackReply | None:
        reply = await ask(p2p, helper, addrs)
        while (reply is None or reply.error.startswith(BUSY)) and queue:
            reply = await ask(p2p, queue.pop(0), addrs)
        return reply

    return list(await asyncio.gather(*(one(helper) for helper in helpers)))


async def helper_groups(p2p, helpers: Sequence[str]) -> dict[str, str]:
    """helper id -> the IP group this node's own connection to it comes from (none for a helper
    it has no connection to): what the helper cannot lie about."""
    wanted = set(helpers)
    groups: dict[str, str] = {}
    for info in await p2p.list_peers():
        helper = info.peer_id.to_base58()
        ips = sorted(a.ip for a in (tcp_addr(str(m)) for m in info.addrs) if a is not None)
        if helper in wanted and ips:
            groups[helper] = ip_group(ips[0])
    return groups
