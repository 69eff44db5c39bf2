"""Token ids in, text deltas out: incremental detokenization with OpenAI's `stop` strings.

Each delta is what became certain since the last one. Text is held back while it ends in an
incomplete UTF-8 character (a byte-level token can split one) or in what could be the start
of a stop string; when a stop string appears, the text before it is the last delta and the
generation is told to stop. The final text equals `tokenizer.decode(all ids)` cut at the
first stop string, so it matches what `generate()` returns.

Decoding runs in the generation thread (`TextAssembler.delta` is the generation's `on_token`),
never on the API's event loop: each step decodes the whole answer so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from hexswarm.client.api.generation import TokenStream

_INCOMPLETE = "\ufffd"  # what decode() makes of a character whose bytes are not all there yet


@dataclass
class Finished:
    """How a generation ended: 'stop' (end of sequence or a stop string) or 'length' (max_tokens)."""

    reason: str
    completion_tokens: int
    verification: dict | None = None  # with --verify: what was compared (client/verify.py summary)
    route: str | None = None  # the chain that served it, as it ended (client/api/answer_report.py)
    failovers: list = field(default_factory=list)  # client.peer_failures.Failover on the way


@dataclass(frozen=True)
class Delta:
    """One new token and the text it made certain."""

    token: int
    text: str
    stopped: bool  # a stop string appeared: the text ends here


class TextAssembler:
    """Accumulates token ids and returns the newly certain text after each one."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.sent = 0  # characters of the text handed out so far
        self.stopped = False  # a stop string was found

    def feed(self, token: int) -> str:
        self.ids.append(token)
        text = self._decode()
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            return self._take(text[:cut])
        return self._take(text[: self._certain_end(text)])

    def delta(self, token: int) -> Delta:
        """`feed` as a record, for the generation thread to hand to the event loop."""
        text = self.feed(token)
        return Delta(token, text, self.stopped)

    def flush(self) -> str:
        """Whatever was held back, once no token will follow."""
        if self.stopped:
            return ""
        return self._take(self._decode())

    def _decode(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def _take(self, text: str) -> str:
        delta = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return delta

    def _first_stop(self, text: str) -> int | None:
        found = [i for i in (text.find(s, max(0, self.sent - len(s) + 1)) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def _certain_end(self, text: str) -> int:
        end = len(text.rstrip(_INCOMPLETE))
        held = 0  # the longest tail that a stop string could still complete
        for stop in self.stop:
            for k in range(min(len(stop) - 1, end), 0, -1):
                if text[end - k : end] == stop[:k]:
                    held = max(held, k)
                    break
        return max(end - held, self.sent)


async def text_deltas(
    stream: TokenStream, assembler: TextAssembler, max_tokens: int, eos_ids: set[int]
) -> AsyncIterator[str | Finished]:
    """Non-empty text deltas, then one `Finished`; re-raises what `generate` raised.

    `stream` yields the `Delta`s of `assembler.delta`; a stop string has stopped the generation
    already (the assembler is its `should_stop`), and `cancel` makes sure of it."""
    count, last = 0, None
    async for delta in stream:
        count, last = count + 1, delta.token
        if delta.text:
            yield delta.text
        if delta.stopped:
            stream.cancel.set()
            break
    if stream.error is not None:
        raise stream.error
    tail = await asyncio.to_thread(assembler.flush)  # the generation thread is done with it
    if tail:
        yield tail
    ended_by_model = assembler.stopped or last in eos_ids
    reason = "stop" if ended_by_model or count < max_tokens else "length"
    yield Finished(reason, count, stream.verification, stream.route, stream.failovers)
