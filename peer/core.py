"""PeerCore: a peer's sessions, KV caches and limits. No sockets here (see peer/server.py).

Every check on what a client asks for lives here and raises `ProtocolError`, which the
transport turns into an error frame; nothing a client sends can crash the peer or make it
hold more cache than its budget.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hexswarm.peer.kv_checks import check_kv
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.tools.threads import torch_threads
from hexswarm.swarm.wire.protocol import (
    Close,
    Closed,
    ErrorCode,
    KvPush,
    KvTarget,
    Open,
    Opened,
    ProtocolError,
    Step,
    StepResult,
)
from hexswarm.swarm.wire.tensors import WIRE_DTYPES, all_finite

# A step of at least this many tokens (batch x new tokens) is a prefill: compute-bound, so it runs
# on `prefill_threads` where a small model decodes on one thread (peer/devices.default_cpu_threads).
PREFILL_TOKENS = 32

logger = logging.getLogger(__name__)


class Blocks(Protocol):
    """What PeerCore runs sessions on: a BlockStack in this process, or a tensor-parallel
    group's leader (peer/tp/blocks.py), which runs the same steps on all its ranks."""

    spec: ModelSpec
    start: int
    end: int
    dtype: torch.dtype
    device: torch.device
    tp: int  # tensor-parallel degree

    def new_cache(self, session_id: str) -> Any: ...

    def release(self, session_id: str) -> None: ...

    def __call__(
        self, hidden: torch.Tensor, cache: Any, position: int, start: int, end: int
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class PeerLimits:
    max_sessions: int = 16
    max_length: int = 2048  # tokens per sequence
    max_batch: int = 16
    cache_tokens: int = 16 * 2048  # KV tokens over all sessions (batch x max_length each)
    # Most KV tokens one session may reserve (None: all of `cache_tokens`); run-peer's default
    # is a quarter of the cache, so no single OPEN can take a peer's whole budget.
    session_cache_tokens: int | None = None
    session_idle_timeout: float = 300.0  # seconds without a step before a session is dropped


def session_key(owner: str, session_id: str) -> str:
    """Where a session lives in a peer: its id within the namespace of the remote that opened
    it, so nobody can open, step or squat another remote's session ids."""
    return f"{owner}/{session_id}" if owner else session_id


@dataclass
class Session:
    session_id: str  # as the client named it (what replies carry)
    start: int
    end: int
    batch_size: int
    max_length: int
    wire_dtype: torch.dtype
    cache: Any  # the Blocks' KV cache for this session (a transformers DynamicCache, or a rank's share)
    position: int = 0  # tokens per sequence already in the cache
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False  # a step is being computed; never expire it then
    upstream: str = ""  # the peer id whose pushed steps this session accepts (peer/push.py); "" = none
    # Disaggregated prefill and decode (swarm/wire/protocol.py): a decode session takes its prompt's
    # keys and values from `kv_from`; a prefill session sends its layers' to `kv_to`.
    kv_from: tuple[str, ...] = ()
    kv_to: tuple[KvTarget, ...] = ()
    kv_imported: dict[int, int] = field(default_factory=dict)  # global layer -> tokens imported
    prompt_length: int = 0  # a decode session: the prompt tokens its OPEN said the keys and values hold
    chain: bytes = b""  # the running hash of its steps' commitments (swarm/wire/commitments.py)
    steps: int = 0  # steps committed
    owner: str = ""  # the remote peer id that opened it

    @property
    def key(self) -> str:
        return session_key(self.owner, self.session_id)

    @property
    def reserved_tokens(self) -> int:
        return self.batch_size * self.max_length


class PeerCore:
    """The sessions of one peer over its Blocks."""

    def __init__(self, blocks: Blocks, model_id: str, limits: PeerLimits, prefill_threads: int | None = None):
        self.blocks = blocks
        self.model_id = model_id
        self.limits = limits
        self.prefill_threads = prefill_threads  # torch threads for steps of PREFILL_TOKENS or more
        self.sessions: dict[str, Session] = {}
        self.leaving = False
        self.failure: str | None = None  # set when part of the peer broke: every request gets PEER_FAILED

    def fail(self, reason: str) -> None:
        """Part of this peer (e.g. a tensor-parallel rank) is gone: refuse everything from now on."""
        self.failure, self.leaving = reason, True

    def _check_not_failed(self) -> None:
        if self.failure is not None:
            raise ProtocolError(ErrorCode.PEER_FAILED, self.failure)

    @property
    def cache_tokens_left(self) -> int:
        return self.limits.cache_tokens - sum(s.reserved_tokens for s in self.sessions.values())

    @property
    def session_cache_tokens_left(self) -> int:
        """What one new session may still reserve: the cache left, up to the per-session share."""
        cap = self.limits.session_cache_tokens
        return self.cache_tokens_left if cap is None else min(cap, self.cache_tokens_left)

    def open(self, request: Open, owner: str = "") -> Opened:
        self.check_open(request, owner)
        key = session_key(owner, request.session_id)
        self.sessions[key] = Session(
            session_id=request.session_id,
            start=request.start,
            end=request.end,
            batch_size=request.batch_size,
            max_length=request.max_length,
            wire_dtype=WIRE_DTYPES[request.dtype],
            cache=self.blocks.new_cache(key),
            upstream=request.upstream,
            kv_from=request.kv_from,
            kv_to=request.kv_to,
            prompt_length=request.prompt_length,
            owner=owner,
        )
        logger.debug("session %s opened for [%d:%d)", request.session_id, request.start, request.end)
        return Opened(request.session_id)

    def check_open(self, r: Open, owner: str = "") -> None:
        """Raises the ProtocolError that `open(r)` would, without opening anything."""
        limits = self.limits
        self._check_not_failed()
        if self.leaving:
            raise ProtocolError(ErrorCode.LEAVING, "this peer is shutting down and takes no new sessions")
        if r.model_id != self.model_id:
            raise ProtocolError(ErrorCode.WRONG_MODEL, f"this peer serves {self.model_id}, not {r.model_id}")
        if not (self.blocks.start <= r.start < r.end <= self.blocks.end):
            raise ProtocolError(
                ErrorCode.WRONG_LAYERS,
                f"blocks [{r.start}:{r.end}) asked, this peer serves [{self.blocks.start}:{self.blocks.end})",
            )
        if r.dtype not in WIRE_DTYPES:
            raise ProtocolError(
                ErrorCode.BAD_TENSOR, f"dtype {r.dtype!r} is not one of {sorted(WIRE_DTYPES)}"
            )
        if not 1 <= r.max_length <= limits.max_length:
            raise ProtocolError(
                ErrorCode.TOO_LONG, f"max_length {r.max_length} is not in 1..{limits.max_length}"
            )
        if not 1 <= r.batch_size <= limits.max_batch:
            raise ProtocolError(ErrorCode.BUSY, f"batch size {r.batch_size} is not in 1..{limits.max_batch}")
        if session_key(owner, r.session_id) in self.sessions:
            raise ProtocolError(ErrorCode.BAD_STATE, f"session {r.session_id} is already open")
        self._check_kv_roles(r)
        if len(self.sessions) >= limits.max_sessions:
            raise ProtocolError(ErrorCode.BUSY, f"all {limits.max_sessions} session slots are taken")
        needed, cap = r.batch_size * r.max_length, limits.session_cache_tokens
        if cap is not None and needed > cap:
            raise ProtocolError(
                ErrorCode.BUSY, f"session needs {needed} cache tokens, one session may reserve {cap}"
            )
        if needed > self.cache_tokens_left:
            raise ProtocolError(
                ErrorCode.BUSY, f"session needs {needed} cache tokens, {self.cache_tokens_left} are left"
            )

    def _check_kv_roles(self, r: Open) -> None:
        """A session that sends or takes keys and values: only where this peer can move them."""
        if r.prompt_length and not (r.kv_from and 1 <= r.prompt_length <= r.max_length):
            raise ProtocolError(
                ErrorCode.BAD_STATE,
                f"prompt_length {r.prompt_length} is for a decode session, in 1..max_length {r.max_length}",
            )
        if not (r.kv_from or r.kv_to):
            return
        if r.kv_from and r.kv_to:
            raise ProtocolError(ErrorCode.BAD_STATE, "a session either sends keys and values or takes them")

        if not getattr(self.blocks, "moves_kv", False):
            raise ProtocolError(
                ErrorCode.BAD_STATE,
                "this peer cannot move keys and values (tensor-parallel, or layers with sliding windows)",
            )
        for target in r.kv_to:
            if not r.start <= target.start < target.end <= r.end:
                raise ProtocolError(
                    ErrorCode.WRONG_LAYERS,
                    f"keys and values of blocks [{target.start}:{target.end}) asked, the session runs [{r.start}:{r.end})",
                )

    def begin_step(self, request: Step, owner: str = "") -> tuple[Session, torch.Tensor]:
        """Validates a step of `owner`'s session and marks it busy; returns the input in the
        compute dtype."""
        self._check_not_failed()
        session = self.get(request.session_id, owner)
        if session.kv_from and len(session.kv_imported) < session.end - session.start:
            raise ProtocolError(
                ErrorCode.BAD_STATE, "the session still waits for its prompt's keys and values"
            )
        if session.kv_to and session.position > 0:
            raise ProtocolError(ErrorCode.BAD_STATE, "a prefill session takes one step: its prompt")
        hidden = request.hidden
        expected_shape = (
            session.batch_size,
            hidden.shape[1] if hidden.ndim == 3 else -1,
            self.blocks.spec.hidden_size,
        )
        if hidden.ndim != 3 or tuple(hidden.shape) != expected_shape or hidden.shape[1] < 1:
            raise ProtocolError(
                ErrorCode.BAD_TENSOR,
                f"hidden states must be (batch={session.batch_size}, new_tokens>=1, "
                f"hidden={self.blocks.spec.hidden_size}), got {tuple(hidden.shape)}",
            )
        if hidden.dtype != session.wire_dtype:
            raise ProtocolError(
                ErrorCode.BAD_TENSOR, f"session dtype is {session.wire_dtype}, got {hidden.dtype}"
            )
        self._check_position(session, request.position)
        if request.position + hidden.shape[1] > session.max_length:
            raise ProtocolError(
                ErrorCode.TOO_LONG,
                f"{request.position} + {hidden.shape[1]} tokens exceed the session's max_length {session.max_length}",
            )
        if not all_finite(hidden):
            raise ProtocolError(ErrorCode.BAD_TENSOR, "hidden states contain NaN or inf")
        if session.busy:
            raise ProtocolError(ErrorCode.BAD_STATE, "a step of this session is already running")
        session.busy, session.position = True, request.position  # the blocks drop what is past it
        return session, hidden.to(self.blocks.device, self.blocks.dtype)

    def _check_position(self, session: Session, position: int) -> None:
        """A step continues the session, or starts below its length: a roll-back of drafted
        tokens its client rejected (docs/speculation.md), where the blocks can forget them."""
        back = position < session.position
        if not 0 <= position <= session.position:
            raise ProtocolError(
                ErrorCode.BAD_STATE, f"step at position {position}, the session is at {session.position}"
            )
        if back and (session.kv_to or not getattr(self.blocks, "rolls_back", False)):
            raise ProtocolError(
                ErrorCode.BAD_STATE,
                f"step at position {position}: this session cannot roll back from {session.position}",
            )

    def run_step(self, session: Session, hidden: torch.Tensor) -> StepResult:
        """The heavy part: runs in the compute thread. Always call after begin_step."""
        return StepResult(session.session_id, self.run_chunk(session, hidden, last=True))

    def run_chunk(self, session: Session, hidden: torch.Tensor, last: bool) -> torch.Tensor:
        """Runs the next tokens of a step (all of them, or a chunk of a prefill); the step
        ends, and the session can take the next one, after the `last` chunk or on error.
        Returns the output on the CPU in the session's wire dtype."""
        many = hidden.shape[0] * hidden.shape[1] >= PREFILL_TOKENS
        try:
            with torch_threads(self.prefill_threads if many else None):
                output = self.blocks(hidden, session.cache, session.position, session.start, session.end)
            session.position += hidden.shape[1]
        except BaseException:
            self.end_step(session)
            raise
        if last:
            self.end_step(session)
        return output.to("cpu", session.wire_dtype)

    @property
    def can_batch(self) -> bool:
        """Whether the blocks run decode steps of many sessions as one batch (a tensor-parallel
        group and sliding-window models do not; their steps run one at a time)."""
        return bool(getattr(self.blocks, "supports_batching", False))

    def run_decode_batch(self, steps: list[tuple[Session, torch.Tensor]]) -> list[StepResult]:
        """One-token steps of several sessions (each after begin_step) as one forward per block
        range; each session gets its own rows back."""
        groups: dict[tuple[int, int], list[tuple[Session, torch.Tensor]]] = {}
        for session, hidden in steps:
            groups.setdefault((session.start, session.end), []).append((session, hidden))
        results: dict[str, StepResult] = {}
        try:
            for (start, end), group in groups.items():
                if len(group) == 1:  # alone: the plain path, bit for bit as unbatched
                    session, hidden = group[0]
                    outputs = [self.blocks(hidden, session.cache, session.position, start, end)]
                else:
                    sessions, hiddens = zip(*group, strict=True)
                    caches = [s.cache for s in sessions]
                    positions = [s.position for s in sessions]
                    outputs = self.blocks.forward_batch(list(hiddens), caches, positions, start, end)
                for (session, _), output in zip(group, outputs, strict=True):
                    session.position += 1
                    results[session.key] = StepResult(
                        session.session_id, output.to("cpu", session.wire_dtype)
                    )
        finally:
            for session, _ in steps:
                self.end_step(session)
        return [results[session.key] for session, _ in steps]

    def import_kv(self, push: KvPush, sender: str) -> None:
        """Takes keys and values of consecutive layers of a prompt from the session's prefill
        peer, all or none of them; the session starts decoding at the prompt's length once it
        has every layer."""
        session = self.sessions.get(session_key(push.owner, push.session_id))
        if session is None or sender not in session.kv_from:
            # the same answer whether the session is unknown or not the sender's to fill
            raise ProtocolError(
                ErrorCode.UNKNOWN_SESSION,
                f"no session {push.session_id!r} takes keys and values from this peer",
            )
        tokens = check_kv(session, push, self.blocks.config, self.blocks.dtype)
        layers = range(push.layer, push.layer + push.keys.shape[0])
        if not (session.start <= layers[0] and layers[-1] < session.end):
            raise ProtocolError(
                ErrorCode.WRONG_LAYERS,
                f"layers [{layers[0]}:{layers[-1] + 1}) are not in the session's [{session.start}:{session.end})",
            )
        if any(layer in session.kv_imported for layer in layers):
            raise ProtocolError(ErrorCode.BAD_STATE, "a layer already has its keys and values")
        for index, layer in enumerate(layers):
            keys, values = push.keys[index].to(self.blocks.device), push.values[index].to(self.blocks.device)
            session.cache.update(keys, values, layer - self.blocks.start)
            session.kv_imported[layer] = tokens
        if len(session.kv_imported) == session.end - session.start:
            session.position = tokens
            session.last_used = time.monotonic()
            logger.debug(
                "session %s: took %d tokens of keys and values from ...%s",
                session.session_id,
                tokens,
                sender[-8:],
            )

    def kv_bytes_per_layer(self, session: Session) -> int:
        """Bytes of one layer's keys and values a prefill session holds (every layer holds as many)."""
        cached = session.cache.layers[session.start - self.blocks.start]
        return cached.keys.nbytes + cached.values.nbytes

    def export_kv(self, session: Session, layers: range) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values a prefill session computed for global `layers`, stacked
        (layers, batch, kv_heads, tokens, head_dim), on the CPU."""
        cached = [session.cache.layers[layer - self.blocks.start] for layer in layers]
        keys = torch.stack([c.keys.to("cpu") for c in cached])
        return keys, torch.stack([c.values.to("cpu") for c in cached])

    def end_step(self, session: Session) -> None:
        session.busy = False
        session.last_used = time.monotonic()

    def close(self, request: Close, owner: str = "") -> Closed:
        self.drop(self.get(request.session_id, owner).key)
        return Closed(request.session_id)

    def get(self, session_id: str, owner: str = "") -> Session:
        session = self.sessions.get(session_key(owner, session_id))
        if session is None:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"no open session {session_id!r} on this peer")
        return session

    def drop(self, key: str) -> None:
        """Frees a session's cache (on close, disconnect or idle timeout); `key` is its Session.key."""
        if self.sessions.pop(key, None) is not None:
            self.blocks.release(key)
            logger.debug("session %s freed", key)

    def expire_idle(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        expired = [
            key
            for key, s in self.sessions.items()
            if not s.busy and now - s.last_used > self.limits.session_idle_timeout
        ]
        for key in expired:
            logger.info(
                "session %s idle for over %.0f s; freeing its cache", key, self.limits.session_idle_timeout
            )
            self.drop(key)
        return expired
