"""What output verification (client/verify.py) keeps and counts: the runs of served steps
waiting for a check, the witnesses' shadow sessions, the counts by outcome, and the errors a
proven lie raises."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from hexswarm.client.remote import PeerConnection, PeerError

# A span's run is checked at the latest when it holds this many unchecked tokens (it is kept until then)
MAX_RUN_TOKENS = 256
# Why a sampled step was not compared (VerifyStats.uncompared)
NO_WITNESS = "no other peer serves the blocks in that format"
NOT_KEPT = "the hop's earlier inputs are not kept"
WITNESS_FAILED = "the witness failed"
DISPUTED = "server and witness disagree and no third opinion settled it"
PUSHED_CACHE = "wrong after a prefill peer's pushed keys and values: the decode peer or the prefill peer"


class VerificationError(PeerError):
    """A peer's output was proven wrong (a witness and a third peer agree); it is banned.
    `position`: the first token whose hidden state it got wrong."""

    def __init__(self, peer: str, peer_id: str, message: str, position: int = 0):
        super().__init__(peer, None, message, peer_id=peer_id)
        self.position = position
        self.args = (f"peer {peer} failed verification: {message}",)


@dataclass
class SpanTally:
    """One span's hop steps in a session, and how many of them a witness compared."""

    steps: int = 0
    compared: int = 0


class NotComparedError(RuntimeError):
    """Verification was asked for, but too few of some span's steps were compared (by default:
    none), usually because no other peer serves its blocks in that format. The output was
    computed but nobody checked it: `output` has it, for a caller who accepts that."""

    def __init__(
        self, short: dict[tuple[int, int], SpanTally], min_compared: float | None, why: str, output=None
    ):
        self.spans, self.output = dict(short), output
        told = ", ".join(
            f"blocks {s}:{e} ({t.compared} of {t.steps} steps compared)"
            for (s, e), t in sorted(short.items())
        )
        wanted = (
            "at least one comparison per span"
            if min_compared is None
            else f"{min_compared:.0%} of each span's steps"
        )
        super().__init__(
            f"verification asked for {wanted}, but got less on {told}"
            + (f"; not compared: {why}" if why else "")
            + ". A span needs two peers that serve it in the same format for one to check the other; "
            "accept unverified output with --verify-min-compared 0 (Python: verify_min_compared=0)"
        )


def short_spans(
    tally: dict[tuple[int, int], SpanTally], min_compared: float | None
) -> dict[tuple[int, int], SpanTally]:
    """The spans whose compared steps fall short: none compared (`min_compared` None), or fewer
    than that share of their steps."""
    if min_compared is None:
        return {span: t for span, t in tally.items() if t.steps and not t.compared}
    return {span: t for span, t in tally.items() if t.steps and t.compared < min_compared * t.steps}


@dataclass(frozen=True)
class Dispute:
    """Steps on which the server and a witness disagreed and no third peer settled who was right."""

    start: int
    end: int
    position: int  # the first token of the disputed run
    servers: tuple[str, ...]  # names of the peers that served the run
    witness: str
    why: str  # why nobody settled it

    def describe(self) -> str:
        return (
            f"blocks {self.start}:{self.end} from token {self.position}: {', '.join(self.servers)} and "
            f"witness {self.witness} disagree, and {self.why}"
        )


class UnsettledDisputeError(RuntimeError):
    """Two peers computed different outputs for a span and no third peer could say which one was
    right: the output is not delivered as checked. `output` has it, for a caller who accepts
    unsettled output (accept_unsettled=True, which counts such steps as not compared)."""

    def __init__(self, disputes: list[Dispute], output=None):
        self.disputes, self.output = list(disputes), output
        shown = "; ".join(d.describe() for d in self.disputes[:3])
        more = f"; and {len(self.disputes) - 3} more" if len(self.disputes) > 3 else ""
        super().__init__(
            f"peers disagreed and nobody could settle who was right, so the output is not given as "
            f"checked: {shown}{more}. Each of them may be the one that is wrong; a span needs a third "
            "peer in the same format to settle it. Accept unsettled output with --accept-unsettled "
            "(Python: accept_unsettled=True)"
        )


def unchecked_output_error(
    verifier, stats: VerifyStats, min_compared: float | None, accept_unsettled: bool, output
):
    """The error a verified generation raises instead of returning `output`, or None: an unsettled
    dispute (unless accepted), else too few comparisons on some span (see NotComparedError), with
    why steps went uncompared from `stats`."""
    if verifier is None:
        return None
    if verifier.disputes and not accept_unsettled:
        return UnsettledDisputeError(verifier.disputes, output)
    short = short_spans(verifier.tally, min_compared)
    if not short:
        return None
    why = "; ".join(f"{n} {reason}" for reason, n in stats.uncompared.most_common())
    return NotComparedError(short, min_compared, why, output)


class RollbackNeeded(Exception):
    """A lie was found in an earlier step than the current one: the tokens after `position`
    came from wrong hidden states. The caller starts again from there without the liar
    (client/model.py does for a non-streaming generate)."""

    def __init__(self, error: VerificationError):
        super().__init__(str(error))
        self.error, self.position = error, error.position


@dataclass
class VerifyStats:
    steps: int = 0  # hop steps seen
    sampled: int = 0  # chosen for a check
    compared: int = 0  # checked against a witness, with a settled outcome
    mismatches: int = 0  # steps where the server and a witness disagreed (settled or not)
    liars: int = 0  # peers proven wrong (a witness and a third peer agree against them)
    rollbacks: int = 0  # generations started again from the last right token (client/model.py)
    uncompared: Counter = field(default_factory=Counter)  # reason -> sampled steps not compared

    @property
    def unverifiable(self) -> int:
        return sum(self.uncompared.values())

    def describe(self) -> str:
        why = "; ".join(f"{n} {reason}" for reason, n in self.uncompared.most_common())
        return (
            f"{self.steps} hop steps, {self.sampled} sampled, {self.compared} compared, "
            f"{self.mismatches} disagreed, {self.liars} liar(s) caught, {self.rollbacks} rollback(s)"
            + (f"; not compared: {why}" if why else "")
        )


@dataclass
class Shadow:
    conn: PeerConnection
    session_id: str
    peer_id: str
    position: int = 0


@dataclass
class Served:
    """One hop step's output as the client got it, kept until a witness has checked it."""

    position: int
    peer_id: str
    output: torch.Tensor  # (batch, new tokens, hidden)
    conn: PeerConnection | None = None  # where its commitments are (client/remote.py)
    session_id: str = ""


@dataclass
class Run:
    """Steps of one span to check at once: the span's inputs up to the run's end and what was served."""

    start: int
    end: int
    quant: str
    inputs: torch.Tensor  # (batch, tokens so far, hidden): everything the span was sent
    served: list[Served]

    @property
    def first(self) -> int:
        return self.served[0].position

    @property
    def outputs(self) -> torch.Tensor:
        return torch.cat([s.output for s in self.served], dim=1)

    @property
    def servers(self) -> set[str]:
        return {s.peer_id for s in self.served}
