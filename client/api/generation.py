"""One API request's generation: `generate()` in a worker thread, its tokens fed to asyncio.

The API server must not block its event loop, and many requests share one
`DistributedModelForCausalLM`: each request runs `model.generate` in a thread of a pool
(the model keeps one swarm session per thread), and a streamer hands every new token to
the request's asyncio queue. The streamer first passes each token through the request's own
`on_token` (the API detokenizes there), so that per-token CPU work runs in the generation
thread, not on the event loop. `should_stop()` turning true (a stop string appeared) ends
`generate` after the step in flight; setting `cancel` (the client went away) ends it within
0.1 s, even mid-step or while a failover waits for a peer. Either way the session closes on
every peer.

Sampling draws from the request's own `torch.Generator`, so concurrent requests do not
share the global RNG. It draws exactly what `generate(do_sample=True)` draws after
`torch.manual_seed(seed)`: the same warpers in the same order, then `softmax` and
`torch.multinomial` (tests/unit/test_api_sampling.py checks this).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper
from transformers.generation.streamers import BaseStreamer

from hexswarm.client.api.answer_report import current_route
from hexswarm.client.drafting import MAX_DRAFTS
from hexswarm.client.worker import Cancelled


@dataclass(frozen=True)
class SamplingSettings:
    """What a request asks of the sampler; temperature 0 means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # run to max_tokens past end-of-sequence tokens (vLLM's extension)
    speculate: bool = True  # greedy: draft from the context, check several tokens a pass

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class SeededSampler:
    """A logits processor that samples the next token with its own generator and leaves only
    that token possible, so greedy decoding inside `generate` picks it."""

    def __init__(self, settings: SamplingSettings):
        self.warpers = []
        if settings.temperature != 1.0:  # as generate() does: 1.0 adds no warper
            self.warpers.append(TemperatureLogitsWarper(settings.temperature))
        if settings.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(settings.top_p))
        seed = settings.seed if settings.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        chosen = torch.multinomial(probs.cpu(), num_samples=1, generator=self.generator).to(scores.device)
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, chosen, 0.0)


def generation_kwargs(model, settings: SamplingSettings) -> dict:
    """The `generate()` arguments for `settings` (greedy decoding plus, when sampling, a SeededSampler)."""
    base = model.generation_config
    config = GenerationConfig(
        max_new_tokens=settings.max_tokens,
        do_sample=False,
        # An empty list, not None: generate() fills None in from the model's own config.
        eos_token_id=[] if settings.ignore_eos else base.eos_token_id,
        bos_token_id=base.bos_token_id,
        pad_token_id=base.pad_token_id if base.pad_token_id is not None else base.eos_token_id,
    )
    if settings.greedy and settings.speculate:  # (seeded sampling would draw differently)
        config.prompt_lookup_num_tokens = MAX_DRAFTS  # client/drafting.py paces how many it checks
    kwargs = {"generation_config": config}
    if not settings.greedy:
        kwargs["logits_processor"] = LogitsProcessorList([SeededSampler(settings)])
    return kwargs


def _token_itself(token: int) -> int:
    return token


def _never() -> bool:
    return False


@dataclass(frozen=True)
class GenerationHooks:
    """What a request adds to its generation. `on_token` and `should_stop` run in the generation
    thread, after each new token (the streamer's `put` comes before `generate` checks its
    stopping criteria, so a stop takes effect at once); `on_finished` runs on the event loop
    once the thread is done with the request, whether `generate` returned, raised or never ran."""

    on_token: Callable[[int], object] = _token_itself  # what the stream yields for each new token id
    should_stop: Callable[[], bool] = _never  # run to max_tokens or the end of the sequence
    on_finished: Callable[[], None] | None = None


class _Stop(StoppingCriteria):
    def __init__(self, cancel: threading.Event, should_stop: Callable[[], bool]):
        self.cancel, self.should_stop = cancel, should_stop

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        stop = self.cancel.is_set() or self.should_stop()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool)


class _QueueStreamer(BaseStreamer):
    """Forwards `on_token(id)` of each new token id (not the prompt, which `generate` puts first)
    to an asyncio queue."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, on_token: Callable, on_first: Callable
    ):
        self.loop, self.queue, self.on_token, self.on_first = loop, queue, on_token, on_first
        self.prompt_seen = self.first_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        if not self.first_seen:  # before the token is queued, so its reader sees what on_first set
            self.first_seen = True
            self.on_first()
        for token in value.reshape(-1).tolist():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, self.on_token(token))

    def end(self) -> None:
        pass  # the worker's own sentinel (after generate returns or raises) ends the stream


_DONE = object()


@dataclass
class TokenStream:
    """`on_token` of each new token of one running generation, as an async iterator; `error`
    holds what `generate` raised, if it did. The queue needs no bound of its own: it holds at
    most max_tokens items and one end marker."""

    queue: asyncio.Queue
    cancel: threading.Event
    error: BaseException | None = None
    verification: dict | None = None  # the model's last_verification, once generate returned
    # The chain serving it: as it stood at the first token, then as it ended once generate returned.
    route: str | None = None
    failovers: list = field(default_factory=list)  # client.peer_failures.Failover, once generate returned

    async def __aiter__(self) -> AsyncIterator:
        while True:
            item = await self.queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                self.error = item
                return
            yield item


def start_generation(
    model,
    executor: Executor,
    input_ids: torch.Tensor,
    settings: SamplingSettings,
    hooks: GenerationHooks | None = None,
) -> TokenStream:
    """Runs `model.generate` for one request in `executor`; returns its token stream at once."""
    hooks = hooks or GenerationHooks()
    loop = asyncio.get_running_loop()
    stream = TokenStream(queue=asyncio.Queue(), cancel=threading.Event())
    kwargs = generation_kwargs(model, settings)

    def note_route() -> None:  # in the generation thread, whose session this is
        stream.route = current_route(model)

    kwargs["streamer"] = _QueueStreamer(loop, stream.queue, hooks.on_token, note_route)
    kwargs["stopping_criteria"] = StoppingCriteriaList([_Stop(stream.cancel, hooks.should_stop)])

    def work() -> None:
        outcome: object = _DONE
        try:
            if not stream.cancel.is_set():  # the client may have left before a thread was free
                with torch.inference_mode():
                    model.generate(
                        input_ids, attention_mask=torch.ones_like(input_ids), cancel=stream.cancel, **kwargs
                    )
        except Cancelled:  # the client left mid-step; nobody reads the stream any more
            pass
        except BaseException as e:  # handed to the request, which answers with an error
            outcome = e
        else:  # read before the end marker; after an error they may be an earlier request's
            _read_how_it_was_served(model, stream)
        loop.call_soon_threadsafe(stream.queue.put_nowait, outcome)
        if hooks.on_finished is not None:
            loop.call_soon_threadsafe(hooks.on_finished)

    loop.run_in_executor(executor, work)
    return stream


def _read_how_it_was_served(model, stream: TokenStream) -> None:
    """The generation thread's last session, as the model kept it when the session closed."""
    stream.verification = getattr(model, "last_verification", None)
    stream.route = getattr(model, "last_route", None) or stream.route
    stream.failovers = list(getattr(model, "last_failovers", None) or [])
