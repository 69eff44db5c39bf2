"""Output verification: a share of a session's hop steps is recomputed by a second peer.

With `verify=p`, each hop step is verified with probability p. The verifying peer (a
*witness*: another online peer that serves the hop's blocks) runs a *shadow session* of its
own for that hop. The shadow is caught up by replaying the hop's earlier inputs, which the
session keeps anyway for failover (client/history.py), in one chunk together with the verified step's input; the witness's output for
the step's tokens is then compared with the serving peer's within a tolerance set by the
coarsest dtype involved (wire dtype and both peers' compute dtypes).

On disagreement, with two peers nobody can tell who is right. So a third peer serving the
blocks, if there is one, recomputes the step as a tie-breaker and the peer it disagrees with
is the culprit; with no third peer, the serving peer is (its output is the one the
generation used, so the client stops trusting it). The culprit is banned by this client (left
out of all its routes), and a signed report naming the evidence (input hash, both output
hashes) is published in the DHT (swarm/reports.py). If the culprit is the serving peer, the
step fails with VerificationError, a PeerError naming that peer, so the session fails over
or fails; if it is the witness, the generation goes on.

Cost: one extra step per verified hop step (a longer one when a shadow catches up); no memory
beyond the failover history. A hop whose start boundary that history does not keep whole
(beyond its `max_history_bytes`) is not verified.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

import torch
from hivemind.utils import get_dht_time

from hexswarm.client.remote import (
    CLOSE_TIMEOUT_S,
    PeerConnection,
    PeerError,
    close_sessions,
    random_session_id,
)
from hexswarm.client.worker import run_sync
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT
from hexswarm.swarm.identity import peer_id_from_owner_marker
from hexswarm.swarm.records import PeerRecord
from hexswarm.swarm.reports import REPORT_TTL_S, Report, publish_report, tensor_hash
from hexswarm.swarm.wire_tensors import DTYPE_NAMES

logger = logging.getLogger(__name__)

# Largest |difference| allowed, relative to the largest |value| of the output (at least 1).
TOLERANCE = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 6e-2}
RECORDS_TTL_S = 30.0  # how long the list of candidate witnesses is reused
PUBLISH_TIMEOUT_S = 5.0
WITNESS_TIMEOUT_S = 30.0  # opening a shadow session and catching it up (a replay of the span's inputs)


class VerificationError(PeerError):
    """A peer's output failed verification; it is banned by this client."""

    def __init__(self, peer: str, peer_id: str, message: str):
        super().__init__(peer, None, message, peer_id=peer_id)
        self.args = (f"peer {peer} failed verification: {message}",)


@dataclass
class VerifyStats:
    steps: int = 0  # hop steps seen
    verified: int = 0  # hop steps recomputed by a witness
    unverifiable: int = 0  # chosen, but no witness serves the blocks (or the history is incomplete)
    mismatches: int = 0


@dataclass
class _Shadow:
    conn: PeerConnection
    session_id: str
    position: int = 0


class Verifier:
    """Verifies a share of one InferenceSession's hop steps; lives as long as the session."""

    def __init__(
        self, session, share: float, stats: VerifyStats | None = None, rng: random.Random | None = None
    ):
        self.session, self.swarm, self.spec = session, session.swarm, session.spec
        self.share = share
        self.rng = rng or random.Random()
        self.stats = (
            stats or VerifyStats()
        )  # may be shared by a model's sessions (counted on the client loop)
        self.shadows: dict[tuple[str, int, int], _Shadow] = {}
        self._records: tuple[float, list[PeerRecord]] = (-RECORDS_TTL_S, [])

    async def after_hop(
        self,
        conn: PeerConnection,
        start: int,
        end: int,
        position: int,
        hidden_in: torch.Tensor,
        output: torch.Tensor,
        quant: str = DEFAULT_QUANT,
    ) -> None:
        """Called by the session after each hop step, before the step's inputs join the session's
        history: maybe verifies the output. A witness catches up from the inputs the session keeps
        for failover (client/history.py); a boundary it does not keep whole is not verified.
        `quant` is the serving peer's weight format: only a peer of the same format can witness
        (a quantized peer computes the model quantized, which is not a lie)."""
        self.stats.steps += 1
        if self.rng.random() >= self.share:
            return
        past = self.session.history.sent_before(start, position, hidden_in)
        if past is not None:
            await self._verify(conn, start, end, past, position, hidden_in, output, quant)

    async def _verify(self, conn, start, end, past, position, hidden_in, output, quant) -> None:
        records = await self._candidates(start, end, exclude={conn.peer_id}, quant=quant)
        if not records:
            self.stats.unverifiable += 1
            return
        witness = self.rng.choice(records)
        theirs = await self._recompute(witness, start, end, past, position, hidden_in)
        self.stats.verified += 1
        if theirs is None or self._agree(output, theirs, conn.peer_id, witness):
            return
        self.stats.mismatches += 1
        await self._judge(conn, witness, start, end, past, position, hidden_in, output, theirs)

    async def _judge(self, conn, witness, start, end, past, position, hidden_in, output, theirs) -> None:
        """The two outputs differ: a third peer (of the same format) breaks the tie if there is one."""
        culprit, other, tie_breaker = conn.peer_id, witness.peer_id, ""
        others = await self._candidates(
            start, end, exclude={conn.peer_id, witness.peer_id}, quant=witness.quant
        )
        if others:
            third = self.rng.choice(others)
            verdict = await self._recompute(third, start, end, past, position, hidden_in)
            if verdict is not None and self._agree(verdict, output, third.peer_id, None):
                culprit, other = witness.peer_id, conn.peer_id  # the third peer sides with the serving peer
            tie_breaker = third.peer_id
        bad_output, good_output = (output, theirs) if culprit == conn.peer_id else (theirs, output)
        report = Report(
            reporter="",
            reported=culprit,
            model_id=self.spec.model_id,
            start=start,
            end=end,
            position=position,
            input_hash=tensor_hash(hidden_in),
            reported_output_hash=tensor_hash(bad_output),
            witness=other,
            witness_output_hash=tensor_hash(good_output),
            max_abs_diff=float((output.float() - theirs.float()).abs().max()),
            tie_breaker=tie_breaker,
            time=get_dht_time(),
        )
        self._ban(culprit)
        await self._publish(report)
        name = self.session.peers.name(culprit)
        logger.warning(
            "peer %s returned a wrong output for blocks [%d:%d); banned and reported", name, start, end
        )
        if culprit == conn.peer_id:
            raise VerificationError(
                name, culprit, f"its output for blocks [{start}:{end}) differs by {report.max_abs_diff:.3g}"
            )

    async def _recompute(
        self, witness: PeerRecord, start, end, past, position, hidden_in
    ) -> torch.Tensor | None:
        """The witness's output for the step, its shadow session caught up first; None if it failed."""
        key = (witness.peer_id, start, end)
        try:
            shadow = self.shadows.get(key) or await self._open_shadow(witness, start, end)
            self.shadows[key] = shadow
            chunk = torch.cat(
                [past[:, shadow.position :], hidden_in], dim=1
            )  # the inputs it has not seen, in one step
            result = await shadow.conn.step(shadow.session_id, shadow.position, chunk)
            shadow.position = position + hidden_in.shape[1]
            return result[:, -hidden_in.shape[1] :]
        except PeerError as e:  # a witness that fails is not evidence against anyone
            logger.info("witness %s could not verify: %s", witness.name, e)
            shadow = self.shadows.pop(key, None)
            if shadow is not None:
                shadow.conn.close()
            return None

    async def _open_shadow(self, witness: PeerRecord, start: int, end: int) -> _Shadow:
        s = self.session
        conn = await self.swarm.open_connection(witness.peer_id, witness.name, timeout=WITNESS_TIMEOUT_S)
        conn.timeout = WITNESS_TIMEOUT_S
        shadow_id = random_session_id()
        try:
            await conn.open(shadow_id, self.spec.model_id, start, end, s.max_length, s.batch_size, s.dtype)
        except BaseException:
            conn.close()
            raise
        return _Shadow(conn, shadow_id)

    def _agree(self, ours: torch.Tensor, theirs: torch.Tensor, peer_a: str, witness) -> bool:
        names = [DTYPE_NAMES.get(self.session.dtype, "float32")]
        records = [r for r in (self._record(peer_a), witness) if isinstance(r, PeerRecord)]
        names += [r.dtype for r in records]
        # int8 layers run their matmuls in bfloat16 (peer/quant.py): two such peers agree to that
        names += ["bfloat16" for r in records if r.quant != DEFAULT_QUANT]
        tolerance = max(TOLERANCE.get(n, max(TOLERANCE.values())) for n in names)
        if ours.shape != theirs.shape:
            return False
        scale = max(1.0, float(theirs.float().abs().max()))
        return float((ours.float() - theirs.float()).abs().max()) <= tolerance * scale

    def _record(self, peer_id: str) -> PeerRecord | None:
        return next((r for r in self._records[1] if r.peer_id == peer_id), None)

    async def _candidates(self, start: int, end: int, exclude: set[str], quant: str) -> list[PeerRecord]:
        loop = asyncio.get_running_loop()
        if loop.time() - self._records[0] > RECORDS_TTL_S:
            records = await asyncio.to_thread(
                self.swarm.online_records, self.spec.model_id, self.spec.num_blocks
            )
            self._records = (loop.time(), records)
        return [
            r
            for r in self._records[1]
            if r.start <= start
            and end <= r.end
            and r.peer_id not in exclude
            and r.peer_id not in self.swarm.distrusted
            and r.quant == quant
        ]

    def _ban(self, peer_id: str) -> None:
        self.swarm.distrusted.add(peer_id)
        self.swarm.forget(peer_id)
        for key in [k for k in self.shadows if k[0] == peer_id]:
            self.shadows.pop(key).conn.close()

    async def _publish(self, report: Report) -> None:
        from hivemind.dht.crypto import RSASignatureValidator

        marker = RSASignatureValidator().local_public_key  # the key this process's DHT node signs with
        report = Report(**{**report.__dict__, "reporter": peer_id_from_owner_marker(marker).to_base58()})
        future = publish_report(self.swarm.dht, marker, report, get_dht_time() + REPORT_TTL_S)
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), PUBLISH_TIMEOUT_S)
        except Exception as e:  # the ban holds even if the DHT is unreachable
            logger.warning("could not publish the report on %s: %s", report.reported, type(e).__name__)

    def close(self) -> None:
        if self.shadows:
            run_sync(self._close_shadows(), timeout=2 * CLOSE_TIMEOUT_S)

    async def _close_shadows(self) -> None:
        shadows, self.shadows = list(self.shadows.values()), {}
        await close_sessions([(shadow.conn, shadow.session_id) for shadow in shadows])
