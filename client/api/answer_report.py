"""How an answer was served, in the API's own response field `hexswarm` (OpenAI clients ignore it).

A swarm answer has a story a plain API does not: which peers served it (the chain, as
`alice[0:12) -> bob[12:30)`), how fast it came (time to first token, tokens per second, as the
API measured them from the request's arrival), which peers failed on the way and who took
over, and with `--verify` how many steps a second peer compared and whether anyone was caught.
The chat page (client/api/chat_page.html) shows these under each answer.

A stream's first chunk carries the chain as it stood at the first token; the chunk with the
finish reason (and a whole answer) carries everything, the chain as it ended included.
Peer names come from their records, which anyone can write: they are escaped here
(`printable`) and shown as text by the page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hexswarm.client.model import ROUTE_LIMIT
from hexswarm.swarm.tools.terminal_text import printable

MAX_FAILOVERS_SHOWN = 16  # a generation that failed over more often says how many in `failovers_total`


@dataclass
class AnswerTiming:
    """When one request arrived, when its first token was ready, and when it ended (monotonic s)."""

    arrived: float
    first_token: float | None = None

    def first_token_now(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic()

    def figures(self, tokens: int, ended: float | None = None) -> dict:
        """Time to first token (queue wait included: what the user waited) and decode tokens/s."""
        if self.first_token is None:
            return {}
        ended = time.monotonic() if ended is None else ended
        decode_s = ended - self.first_token
        per_s = (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else None
        return {
            "time_to_first_token_s": round(self.first_token - self.arrived, 3),
            "tokens_per_s": None if per_s is None else round(per_s, 2),
            "tokens": tokens,
        }


def current_route(model) -> str | None:
    """The chain of this thread's open swarm session (None for a local model or before one opened)."""
    session = getattr(model, "session", None)
    if session is None or not hasattr(session, "describe_route"):
        return None
    return printable(session.describe_route(), ROUTE_LIMIT)


def failover_summary(failovers: list) -> list[dict]:
    """client.peer_failures.Failover records as the page shows them: who failed, on which blocks,
    why, and how long the repair took."""
    shown = []
    for f in failovers[:MAX_FAILOVERS_SHOWN]:
        recovered = f.recovered - f.detected if f.recovered else None
        shown.append(
            {
                "peer": printable(f.peer, 64),
                "blocks": f"{f.start}:{f.end}",
                "error": printable(f.error, 240),
                "recovered_s": None if recovered is None else round(recovered, 3),
            }
        )
    return shown


def live_extension(route: str | None) -> dict | None:
    """What a stream's first chunk adds: the chain serving it so far."""
    return None if route is None else {"route": route}


def final_extension(finished, timing: AnswerTiming | None) -> dict | None:
    """What the last chunk or a whole answer adds (`finished` is client.api.text.Finished)."""
    extension: dict = {}
    if finished.route is not None:
        extension["route"] = finished.route
        extension["failovers"] = failover_summary(finished.failovers)
        extension["failovers_total"] = len(finished.failovers)
    if timing is not None:
        extension["timing"] = timing.figures(finished.completion_tokens)
    if finished.verification is not None:
        extension["verification"] = finished.verification
    return extension or None


def with_extension(body: dict, extension: dict | None) -> dict:
    """`body` with hexswarm's own field, when there is anything to say."""
    if extension:
        body["hexswarm"] = extension
    return body
