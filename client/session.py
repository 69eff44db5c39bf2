"""An inference session: one sequence batch's path through the swarm.

Opening picks a route (ordered hops covering every block) with the client's router, then
opens a remote session on each hop's peer; each step sends the new tokens' hidden states
through the hops in order (client-relayed) and returns the last hop's output. Each peer
keeps the session's KV cache for its blocks until the session closes.
"""

from __future__ import annotations

import logging
import secrets

import torch

from client.remote import PeerConnection, PeerError
from client.swarm_client import SwarmClient
from client.worker import run_sync
from routing.chains.swarm_view import NoRouteError, Route, Router, RouteRequest
from swarm.model_spec import ModelSpec
from swarm.protocol import ErrorCode

logger = logging.getLogger(__name__)

OPEN_ATTEMPTS = 3  # routes tried when peers refuse or vanish while a session opens


class InferenceSession:
    """Remote sessions along one route; `step` is synchronous (it runs on the client loop)."""

    def __init__(
        self,
        swarm: SwarmClient,
        router: Router,
        spec: ModelSpec,
        *,
        max_length: int,
        batch_size: int,
        dtype: torch.dtype,
        coverage_timeout: float,
        step_timeout: float,
    ):
        self.swarm, self.router, self.spec = swarm, router, spec
        self.max_length, self.batch_size, self.dtype = max_length, batch_size, dtype
        self.coverage_timeout, self.step_timeout = coverage_timeout, step_timeout
        self.session_id = secrets.token_hex(8)
        self.route: Route | None = None
        self.names: dict[str, str] = {}  # peer id -> name, for messages
        self.connections: list[PeerConnection] = []
        self.position = 0  # tokens of each sequence the swarm has cached
        self.verifier = None  # a client/verify.py Verifier when the caller asked for verify > 0

    def open(self) -> InferenceSession:
        request = RouteRequest(prompt_tokens=self.max_length, new_tokens=0, batch_size=self.batch_size)
        excluded: set[str] = set()
        for attempt in range(OPEN_ATTEMPTS):
            records = self.swarm.wait_for_coverage(
                self.spec.model_id, self.spec.num_blocks, self.coverage_timeout
            )
            excluded |= {r.peer_id for r in records if r.max_length < self.max_length}  # too short for us
            self.names = {r.peer_id: r.name for r in records}
            view = self.swarm.view(records, self.spec.num_blocks, self.spec.hidden_size)
            try:
                self.route = self.router.choose(view, request, exclude=frozenset(excluded))
            except NoRouteError as e:
                raise PeerError("(none)", None, f"no usable chain: {e}") from None
            try:
                self.connections = run_sync(
                    self._open_hops(), timeout=self.step_timeout * len(self.route.hops)
                )
                logger.info("session %s: route %s", self.session_id, self.describe_route())
                return self
            except PeerError as e:
                failed = e.peer_id
                retryable = e.code in (
                    None, ErrorCode.BUSY, ErrorCode.LEAVING, ErrorCode.TOO_LONG, ErrorCode.PEER_FAILED
                )
                if attempt + 1 == OPEN_ATTEMPTS or failed is None or not retryable:
                    raise
                logger.info("peer %s could not open a session (%s); routing around it", e.peer, e.message)
                excluded.add(failed)
                self.swarm.forget(failed)
        raise AssertionError("unreachable")

    async def _open_hops(self) -> list[PeerConnection]:
        opened: list[PeerConnection] = []
        try:
            for hop in self.route.hops:
                name = self.names.get(hop.peer_id, hop.peer_id)
                conn = await self.swarm.open_connection(hop.peer_id, name, timeout=self.step_timeout)
                opened.append(conn)
                conn.timeout = self.step_timeout
                await conn.open(
                    self.session_id,
                    self.spec.model_id,
                    hop.start,
                    hop.end,
                    self.max_length,
                    self.batch_size,
                    self.dtype,
                )
        except BaseException:
            for conn in opened:
                conn.close()
            raise
        return opened

    def step(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (batch, new_tokens, hidden_size) -> the same shape, after every block."""
        if self.position + hidden.shape[1] > self.max_length:
            raise ValueError(
                f"session max_length {self.max_length} reached ({self.position} + {hidden.shape[1]})"
            )
        output = run_sync(
            self._step(hidden.to(self.dtype).contiguous()), timeout=self.step_timeout * len(self.connections)
        )
        self.position += hidden.shape[1]
        return output

    async def _step(self, hidden: torch.Tensor) -> torch.Tensor:
        for hop, conn in zip(self.route.hops, self.connections, strict=True):
            output = await conn.step(self.session_id, self.position, hidden)
            if self.verifier is not None:
                await self.verifier.after_hop(conn, hop.start, hop.end, self.position, hidden, output)
            hidden = output
        return hidden

    def close(self) -> None:
        if self.verifier is not None:
            self.verifier.close()
        if self.connections:
            run_sync(self._close_all(), timeout=10)
            self.connections = []

    async def _close_all(self) -> None:
        for conn in self.connections:
            try:
                await conn.close_session(self.session_id)
            except PeerError as e:
                logger.debug("closing on %s: %s", conn.peer_name, e)
            finally:
                conn.close()

    def describe_route(self) -> str:
        if self.route is None:
            return "(no route)"
        return " -> ".join(
            f"{self.names.get(h.peer_id, h.peer_id[-6:])}[{h.start}:{h.end})" for h in self.route.hops
        )

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
