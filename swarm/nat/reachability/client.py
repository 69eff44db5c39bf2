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
    DIALBACK_PROTOCOL,
    MAX_REQUEST_BYTES,
    DialBackReply,
    decode_reply,
    encode_request,
)
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
    """One helper's dial-back of `addrs`; None if it could not be asked or did not answer."""
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
    while True:
        try:
            reply = await asyncio.wait_for(exchange(), max(deadline - time.monotonic(), 0.1))
        except Exception as e:
            logger.debug("dial-back by ...%s: %s: %s", helper[-8:], type(e).__name__, e)
            return None
        # a busy helper (its other requests, or one from our IP group) is asked again, not skipped:
        # peers behind one NAT that start together must not read "busy" as "nobody could check"
        if not reply.error.startswith(BUSY) or time.monotonic() + BUSY_RETRY_S >= deadline:
            return reply
        await asyncio.sleep(BUSY_RETRY_S * random.uniform(1, 2))


async def ask_many(p2p, helpers: Sequence[str], addrs: Sequence[str]) -> list[DialBackReply | None]:
    """Asks every helper at once."""
    return list(await asyncio.gather(*(ask(p2p, helper, addrs) for helper in helpers)))
