"""`DistributedModelForCausalLM`: a Hugging Face causal LM whose transformer layers run in the swarm.

The client holds only the embeddings, the final norm and the LM head; `forward` embeds the
new tokens, sends their hidden states through an `InferenceSession`, and turns the result
into logits. So `model.generate(...)` works with the usual arguments (greedy, sampling,
stopping criteria, ...), and greedy output equals the full model's, token for token.

The swarm keeps the KV cache, so `forward` only ever sends tokens the swarm has not seen:
`generate` is wrapped in a session sized for prompt + new tokens, and the empty HF cache
object it passes around is only there to make `generate` send one new token per step.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from hexswarm.client.drafting import DraftLength, PacedDrafts, rolls_back
from hexswarm.client.evidence_sync import EVIDENCE_ROUND_S, EvidenceSync
from hexswarm.client.generate_lengths import generation_length, rollback_arguments
from hexswarm.client.local_parts import build_local_parts
from hexswarm.client.peer_failures import Failover
from hexswarm.client.remote import PeerError
from hexswarm.client.retry import BanList, RetryPolicy
from hexswarm.client.session import InferenceSession
from hexswarm.client.swarm_client import SwarmClient
from hexswarm.client.verify import Verifier
from hexswarm.client.verify_records import (
    NotComparedError,
    RollbackNeeded,
    UnsettledDisputeError,
    VerifyStats,
    unchecked_output_error,
)
from hexswarm.client.worker import run_sync
from hexswarm.routing.chains.swarm_view import Router
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, accepted_formats
from hexswarm.swarm.commands.cli_args import PUBLIC_VERIFY_RATE
from hexswarm.swarm.models import architectures
from hexswarm.swarm.models.model_spec import ModelSpec, load_model_spec
from hexswarm.swarm.net.dht import NO_PUBLIC_PEERS, public_initial_peers
from hexswarm.swarm.tools.terminal_text import printable
from hexswarm.swarm.tools.threads import openmp_spins, torch_threads

logger = logging.getLogger(__name__)

# transformers 5 renamed the outputs' `past_key_values` to `cache` (the old name logs a deprecation)
_OUTPUT_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
DEFAULT_COVERAGE_TIMEOUT_S = 60.0  # how long to wait for every block to have an online peer
# The winner of the multi-client load benchmark (docs/benchmarks.md "Router").
DEFAULT_ROUTING = "tradeoff"
MAX_ROLLBACKS = 8  # a generation starts again at most this often (each time without a proven liar)
ROUTE_LIMIT = 4096  # characters of `last_route`: dozens of hops of names cut to the records' limit


class _ThreadSessions(threading.local):
    """Each thread's own session state, so threads can call `generate` on one model at once
    (the API server does), each with its own swarm session."""

    session: InferenceSession | None = None
    max_length: int | None = None  # set while inside `inference_session`
    verify: float | None = None  # this call's `verify=` (None: the model's)
    cancel: threading.Event | None = None  # this call's `cancel=`: set, it stops waiting on peers
    last_route: str | None = None
    last_failovers: list | None = None  # client.peer_failures.Failover of the last session
    last_hop_steps: dict | None = None  # hop steps sent by the client / pushed by peers, last session
    last_swarm_s: float = 0.0  # seconds the last session's steps waited on the chain
    last_verification: dict | None = None  # what the last session's verifier compared, per span
    tokens: torch.Tensor | None = None  # what this generation's session was fed (for a rollback)


class DistributedMixin:
    """Mixed into the model's own HF class (LlamaForCausalLM, ...) in front of it."""

    swarm: SwarmClient
    router: Router
    spec: ModelSpec
    verify: float = 0.0  # share of hop steps a second peer recomputes (client/verify.py)
    accept_unsettled: bool = False  # return output whose disputes no third peer settled
    # Peers push outputs to the next peer (peer/push.py): a step crosses n + 1 links instead of
    # 2n, which saves one network latency per hop across real networks (docs/reliability.md
    # "Push between peers").
    push: bool = True
    threads: int | None = None  # torch threads for the client's own ops (None: the process's)

    def _init_swarm(self, spec, swarm, router, coverage_timeout, retry: RetryPolicy, wire_dtype) -> None:
        self.spec, self.swarm, self.router = spec, swarm, router
        self._shut_down = False
        atexit.register(self.shutdown)
        self.coverage_timeout, self.retry, self.wire_dtype = coverage_timeout, retry, wire_dtype
        self.bans = BanList(retry)  # peers this client avoids, across its sessions and threads
        self.evidence = EvidenceSync(swarm, spec)  # re-checks evidence of lies that peers announce
        self.drafts = DraftLength()  # what speculative passes cost and yield on this client's chains
        self._threads = _ThreadSessions()

    @property
    def session(self) -> InferenceSession | None:
        """This thread's open swarm session, if any."""
        return self._threads.session

    @session.setter
    def session(self, value: InferenceSession | None) -> None:
        self._threads.session = value

    @property
    def last_route(self) -> str | None:
        """The chain this thread's last session used, e.g. 'alice[0:2) -> bob[2:8)'."""
        return self._threads.last_route

    @last_route.setter
    def last_route(self, value: str | None) -> None:
        # The route names peers by the names they chose, and callers print it: escape it once here.
        self._threads.last_route = None if value is None else printable(value, ROUTE_LIMIT)

    @contextlib.contextmanager
    def inference_session(self, max_length: int):
        """Keeps one swarm session (sized for `max_length` tokens per sequence) across calls."""
        outer = self._threads.max_length
        if outer is not None:  # already inside a session: reuse it
            yield self.session
            return
        self._threads.max_length = max_length
        try:
            yield self
        finally:
            self._threads.max_length = None
            self._close_session()

    @property
    def last_failovers(self) -> list[Failover]:
        """The failovers (peer, blocks, error, timings) of this thread's last session."""
        return list(self._threads.last_failovers or [])

    @property
    def last_hop_steps(self) -> dict[str, int]:
        """This thread's last session: hop steps the client sent ("sent"), that peers pushed to
        each other ("pushed"), and pushes that failed and were relayed ("push_failed")."""
        return dict(self._threads.last_hop_steps or {})

    @property
    def last_swarm_s(self) -> float:
        """Seconds this thread's last session waited on the swarm for its steps; the rest of
        its generate() was the client's own work (embeddings, LM head, sampling)."""
        return self._threads.last_swarm_s

    @property
    def last_verification(self) -> dict | None:
        """This thread's last session, verified: steps and comparisons per span (None: unverified)."""
        return self._threads.last_verification

    def _close_session(self) -> None:
        if self.session is not None:
            verifier = self.session.verifier
            self._threads.last_verification = verifier.summary() if verifier is not None else None
            self._threads.last_failovers = self.session.failovers
            self._threads.last_hop_steps = dict(self.session.hop_steps)
            self._threads.last_swarm_s = self.session.swarm_s
            self.last_route = self.session.describe_route()  # failovers may have changed it
            self.session.close()
            self.session = None

    def generate(self, inputs: torch.Tensor | None = None, *args, **kwargs):
        beams = max(kwargs.get("num_beams", 1), getattr(kwargs.get("generation_config"), "num_beams", 1) or 1)
        if beams > 1:
            raise NotImplementedError(
                "beam search would reorder the swarm's KV caches; use greedy or sampling"
            )
        self._threads.verify = kwargs.pop("verify", None)
        self._threads.cancel = kwargs.pop("cancel", None)
        if (self.verify if self._threads.verify is None else self._threads.verify) > 0:
            self._evidence_round_due()
        prompt = inputs if inputs is not None else kwargs.get("input_ids")
        try:
            for rollbacks in itertools.count():
                try:
                    return self._generate_checked(inputs, args, kwargs)
                except RollbackNeeded as e:
                    if (
                        kwargs.get("streamer") is not None
                        or rollbacks >= MAX_ROLLBACKS
                        or self._threads.tokens is None
                    ):
                        raise e.error from None  # tokens already out (or too many liars): the error
                    inputs, kwargs = self._rolled_back(e.position, inputs, kwargs)
        except (
            PeerError,
            NotComparedError,
            UnsettledDisputeError,
        ) as e:  # what was generated is the caller's
            if isinstance(e, PeerError):
                e.partial_output = self._threads.tokens  # prompt and new tokens, (batch, length)
            e.prompt_length = prompt.shape[1] if prompt is not None else None
            raise
        finally:
            self._threads.verify = self._threads.cancel = self._threads.tokens = None

    def recheck_evidence(self, timeout: float = 600.0) -> dict[str, str]:
        """Re-checks, now, the evidence of lies that peers announce for this model (client/
        evidence_sync.py): liar peer id -> this client's verdict ("proven" bans it). A client
        that verifies does this in the background every EVIDENCE_ROUND_S."""
        self.evidence.last_round = time.monotonic()
        return run_sync(self.evidence.round(), timeout)

    def _evidence_round_due(self) -> None:
        if time.monotonic() - self.evidence.last_round >= EVIDENCE_ROUND_S:
            self.evidence.last_round = time.monotonic()
            self.swarm.spawn(self.evidence.round_logged())

    def _generate_checked(self, inputs, args, kwargs):
        """One generation in one session; with verification on and no streamer, every step the
        verifier has not checked yet is checked before the output returns."""
        with (
            torch_threads(self.threads),
            self.inference_session(max_length=generation_length(inputs, kwargs, self.generation_config)),
        ):
            output = super().generate(inputs, *args, **kwargs)
            if self.session is not None:  # streamed: only disputes (the tokens are out, unchecked)
                streamed = kwargs.get("streamer") is not None
                if not streamed:
                    self.session.finish_verification()
                self._require_checked(output, min_compared=0.0 if streamed else self.verify_min_compared)
            return output

    def _require_checked(self, output: torch.Tensor, min_compared: float | None) -> None:
        """UnsettledDisputeError or NotComparedError when verification could not vouch for the
        output (see `accept_unsettled` and `verify_min_compared` in from_pretrained)."""
        verifier, stats = self.session.verifier, self.verify_stats
        error = unchecked_output_error(verifier, stats, min_compared, self.accept_unsettled, output)
        if error is not None:
            raise error

    def _rolled_back(self, position: int, inputs, kwargs):
        """The generation's inputs and arguments to start again from: the tokens up to and
        including `position` (the first whose hidden state was wrong came from right ones)."""
        logger.warning("a lie was found at token %d: generating again from there without the liar", position)
        self.verify_stats.rollbacks += 1
        total = generation_length(inputs, kwargs, self.generation_config)
        return rollback_arguments(inputs, kwargs, self._threads.tokens, position, total)

    def _get_candidate_generator(self, generation_config, *args, **kwargs):
        """Assisted generation (`prompt_lookup_num_tokens=`, `assistant_model=`) through the swarm:
        Hugging Face's drafter, its drafts paced by what passes cost (client/drafting.py)."""
        if not rolls_back(self.spec.config):
            raise ValueError(
                "speculative steps need peers that can roll back; this model has sliding windows"
            )
        drafter = super()._get_candidate_generator(generation_config, *args, **kwargs)
        return PacedDrafts(drafter, self.drafts, generation_config.max_length)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if labels is not None:
            raise NotImplementedError("training through the swarm is not supported")
        cache = kwargs.pop("past_key_values", cache)  # the name before transformers 5.x's rename
        if attention_mask is not None and attention_mask.ndim == 2 and not bool(attention_mask.all()):
            raise NotImplementedError("padded batches are not supported yet: pass sequences of equal length")
        with torch_threads(self.threads):
            if inputs_embeds is None:
                inputs_embeds = self.model.embed_tokens(input_ids)
            start = int(position_ids[0, 0]) if position_ids is not None else None
            if self._threads.max_length is None:  # a bare forward() call: a one-shot session
                with self.inference_session(max_length=inputs_embeds.shape[1]):
                    return self._forward_in_session(inputs_embeds, start, logits_to_keep, cache)
            return self._forward_in_session(inputs_embeds, start, logits_to_keep, cache, input_ids)

    def _track_tokens(self, position: int, input_ids) -> None:
        """Keeps the tokens the session has been fed, so a generation can roll back to a token."""
        threads = self._threads
        if input_ids is None or (position and threads.tokens is None):
            threads.tokens = None  # fed embeddings: no rollback
        elif position == 0:
            threads.tokens = input_ids.detach().clone()
        else:  # (cut first: a speculative pass may have rolled back rejected drafts)
            threads.tokens = torch.cat([threads.tokens[:, :position], input_ids.detach()], dim=1)

    def _forward_in_session(self, inputs_embeds, start, logits_to_keep, cache, input_ids=None):
        session = self._session_for(inputs_embeds, start)
        position = session.position
        self._track_tokens(position, input_ids)
        began = time.perf_counter()
        hidden = session.step(inputs_embeds)
        if position and inputs_embeds.shape[0] == 1:  # a decode pass: what drafting weighs
            self.drafts.passed(inputs_embeds.shape[1], time.perf_counter() - began)
        hidden = self.model.norm(hidden.to(self.model.norm.weight.dtype))
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = architectures.final_logits(self.config, self.lm_head(hidden[:, keep, :]))
        return CausalLMOutputWithPast(logits=logits, **{_OUTPUT_CACHE_FIELD: cache})

    def _session_for(self, embeds: torch.Tensor, start: int | None) -> InferenceSession:
        """The open session these tokens continue, opening (or restarting) one when needed."""
        batch, new_tokens = embeds.shape[:2]
        session = self.session
        restart = session is not None and (start == 0 or session.batch_size != batch)
        if session is not None and not restart and start is not None and start != session.position:
            session.roll_back(start)  # rejected drafts (ValueError past what the swarm has cached)
        if session is None or restart:
            self._close_session()
            session = InferenceSession(
                self.swarm,
                self.router,
                self.spec,
                max_length=self._threads.max_length,
                batch_size=batch,
                dtype=self.wire_dtype,
                coverage_timeout=self.coverage_timeout,
                policy=self.retry,
                bans=self.bans,
                push=self.push,
            )
            share = self._threads.verify if self._threads.verify is not None else self.verify
            session.verifier = Verifier(session.checked(), share, self.verify_stats) if share > 0 else None
            session.cancel = self._threads.cancel
            self.session = session.open(prompt_tokens=new_tokens)
            self.last_route = self.session.describe_route()
        self.session.cancel = self._threads.cancel  # this call's, on a session kept across calls too
        return self.session

    def shutdown(self) -> None:
        """Closes the session, the router and the client's DHT node. Safe to call twice;
        registered to run at interpreter exit, so a forgotten call leaves nothing running."""
        if self._shut_down:
            return
        self._shut_down = True
        atexit.unregister(self.shutdown)
        try:
            self._close_session()
        finally:
            close_router = getattr(self.router, "close", None)  # e.g. the trade-off router's worker thread
            if close_router is not None:
                close_router()
            self.swarm.shutdown()


class DistributedModelForCausalLM:
    """Entry point: `DistributedModelForCausalLM.from_pretrained(MODEL_DIR, initial_peers=[...])`."""

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        initial_peers: Sequence[str] | None = None,
        *,
        public: bool = False,
        routing: str = DEFAULT_ROUTING,
        preference: float | None = None,
        router: Router | None = None,
        dtype: torch.dtype = torch.float32,
        coverage_timeout: float = DEFAULT_COVERAGE_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        host_maddrs: Sequence[str] | None = None,
        verify: float | None = None,
        verify_min_compared: float | None = None,
        accept_unsettled: bool = False,
        push: bool = True,
        threads: int | None = None,
        quant: str | Sequence[str] = (DEFAULT_QUANT,),
    ):
        """Loads embeddings, norm and LM head of `model_dir` and joins the swarm through `initial_peers`.

        `routing` picks how chains are chosen: "min_latency", "max_throughput" or "tradeoff"
        (NSGA-II over load-aware costs; `preference` in [0, 1] leans from latency to throughput,
        or "knee"). The default, "tradeoff" at preference 0, takes the least latency *under the
        swarm's announced load*, which is not `min_latency`'s idle cost: in the router benchmark
        (docs/benchmarks.md, Router) it was never more than 2% behind `min_latency` and at 100
        and 500 peers cut p99 latency by 35-65%, while the knee took longer chains and lost;
        `router` overrides it with any object that has the `routing.chains.swarm_view.Router` interface.
        `dtype` is the client's compute dtype and the dtype of hidden states on the wire.
        The first step of a session waits up to `coverage_timeout` seconds for every block
        to have an online peer, then fails with an error naming the blocks still missing.
        `retry` sets failover (client.retry.RetryPolicy): retries and seconds per generate()
        call, backoff, bans, step deadlines, and the bound on the hop inputs kept for replay.
        `verify` in [0, 1]: at that share of hop steps, a second peer recomputes the span's steps
        not checked yet, and a non-streaming generate() checks the rest before it returns
        (client/verify.py); default 0.05 with `public=True`, else 0. `generate(..., verify=p)`
        overrides it for one call. A non-streaming generate() with verification raises
        NotComparedError (its `output` holds the unchecked output) when a span had no step
        compared, e.g. because no second peer serves it in that format; `verify_min_compared`
        in [0, 1] asks for that share of each span's steps instead (0 accepts anything). When a
        server and a witness disagree and no third peer settles it, generate() raises
        UnsettledDisputeError (streamed: once the tokens are out) unless `accept_unsettled`.
        `generate(..., cancel=event)` (a threading.Event): once another thread sets it, the call
        stops within 0.1 s, even mid-step or mid-failover, raising client.worker.Cancelled, and
        closes its session on every peer (the API server sets it when its client leaves).
        `push` (default True): each peer sends its output straight to the next peer of the chain,
        and the client reads every hop's output; False relays every hop through the client
        (docs/reliability.md "Push between peers"). Settable later as `model.push`.
        `host_maddrs`: None (the default) dials out only: the client opens no port and asks no
        router for a NAT port mapping; give addresses to listen on, e.g. ["/ip4/0.0.0.0/tcp/0"].
        `threads`: torch threads for the client's own ops; by default 1 when torch was imported
        first with OpenMP spinning (idle spinning threads would take the cores of peers on the
        same machine), else the process's setting.
        `quant` names the weight formats of peers this client accepts ("none", "int8", "nf4"; a
        name or a tuple). The default, full precision only, gives exactly the model; accepting a
        quantized format lets routes use peers that store its blocks in fewer bytes, whose
        output is exactly the model quantized that way (docs/operations.md "Quantized peers").
        """
        accepted = accepted_formats(quant)
        spec = load_model_spec(model_dir)
        peers = public_initial_peers() if public else list(initial_peers or [])
        if not peers:
            raise ValueError(
                NO_PUBLIC_PEERS
                if public
                else "pass initial_peers=[...] (the bootstrap's multiaddrs) or public=True"
            )
        model = build_local_parts(DistributedMixin, spec, dtype)
        if router is None:
            from hexswarm.routing.chains.routers import make_router

            router = make_router(routing, preference)
        if verify is None:
            verify = PUBLIC_VERIFY_RATE if public else 0.0
        if not 0.0 <= verify <= 1.0:
            raise ValueError(f"verify must be in [0, 1], got {verify}")
        if verify_min_compared is not None and not 0.0 <= verify_min_compared <= 1.0:
            raise ValueError(f"verify_min_compared must be in [0, 1], got {verify_min_compared}")
        swarm = SwarmClient.connect(peers, host_maddrs, accepted)
        model._init_swarm(spec, swarm, router, coverage_timeout, retry or RetryPolicy(), dtype)
        model.verify, model.verify_stats, model.push = verify, VerifyStats(), push
        model.verify_min_compared, model.accept_unsettled = verify_min_compared, accept_unsettled
        model.threads = threads if threads is not None else (1 if openmp_spins() else None)
        return model
