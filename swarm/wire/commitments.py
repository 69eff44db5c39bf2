"""What a peer commits to for each step of a session, and signs in batches.

Per step, 8 bytes on the wire: every STEP_RESULT carries `digest = H(input)`, an 8-byte BLAKE2b
of the hidden states the peer computed on (dtype, shape and bytes, as they crossed the wire).
The client holds its own copy of each hop's input (the previous hop's output, which every hop
sends it) and checks it on every step (client/remote.py). That is what lets peers push to each
other while the client verifies (client/verify.py): a peer that sends the client one output
and the next peer another is seen at once, because the next peer's digest names the input it
really got.

Signed in batches: both sides fold each step into a running hash of the session,

    chain = H16(chain | position after the step | H(input) | H(output))

and every SIGN_EVERY steps (and whenever the client asks, with ATTEST) the peer signs the
*statement* (model, client, session, blocks, the format it computes in, position, chain) with
its identity key: one RSA
signature per 64 steps. A signed chain binds the peer to every input and output of the
session up to that position, so a wrong output it returned becomes evidence that anyone with
the inputs can re-check by recomputing (swarm/trust/evidence.py). On decode steps that is 8 bytes a
token and a hop, plus 256 / 64 = 4 for the signatures.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgpack
import torch

from hexswarm.swarm.wire.tensors import hash_tensor

DIGEST_BYTES = 8
CHAIN_BYTES = 16
SIGN_EVERY = 64  # steps of a session between two signed statements
STATEMENT_KIND = "hexswarm/commitment/2"
MAX_SIGNATURE_BYTES = 1024


def tensor_digest(tensor: torch.Tensor) -> bytes:
    return hash_tensor(tensor, hashlib.blake2b(digest_size=DIGEST_BYTES)).digest()


def next_chain(chain: bytes, position: int, input_digest: bytes, output_digest: bytes) -> bytes:
    """The session's running hash after a step that ended at `position`."""
    step = chain + position.to_bytes(8, "big") + input_digest + output_digest
    return hashlib.blake2b(step, digest_size=CHAIN_BYTES).digest()


@dataclass(frozen=True)
class SessionId:
    """Whose session, on which blocks: what a signed statement is about."""

    model_id: str
    owner: str  # the client's peer id (base58), which opened the session
    session_id: str
    start: int
    end: int
    # the format the peer computes in (a dtype name, or "int8"), which sets how far a re-check
    # may differ (swarm/trust/verify_tolerance.py): signed, so nobody else can choose it
    format: str


def statement(session: SessionId, position: int, chain: bytes) -> bytes:
    """The bytes a peer signs: it computed this session's steps up to `position` as `chain` says."""
    body = [STATEMENT_KIND, session.model_id, session.owner, session.session_id, session.start, session.end]
    body.append(session.format)
    return msgpack.packb([*body, position, chain], use_bin_type=True)


@dataclass(frozen=True)
class StepRecord:
    position: int  # the session's position after the step
    input_digest: bytes
    output_digest: bytes


@dataclass(frozen=True)
class Signed:
    position: int
    chain: bytes
    signature: bytes


@dataclass
class CommitmentLog:
    """One session's steps as the client saw them, and the statements the peer signed."""

    session: SessionId
    # where its steps begin: a decode session starts after its prompt, whose keys and values a
    # prefill peer pushed (its commitments cover only what it computed)
    first: int = 0
    records: list[StepRecord] = field(default_factory=list)
    chains: list[bytes] = field(default_factory=list)  # the chain after each record
    signed: list[Signed] = field(default_factory=list)
    rolled_back: bool = False  # a step started below the last one's end (rejected drafts dropped)

    @property
    def position(self) -> int:
        return self.records[-1].position if self.records else self.first

    @property
    def chain(self) -> bytes:
        return self.chains[-1] if self.chains else b""

    def add(self, tokens: int, input_digest: bytes, output_digest: bytes, start: int | None = None) -> None:
        """A step of `tokens` tokens from `start` (None: where the last one ended; lower: the
        peer rolled back rejected drafts first, as the chain it signs says)."""
        start = self.position if start is None else start
        self.rolled_back |= start < self.position
        record = StepRecord(start + tokens, input_digest, output_digest)
        self.chains.append(next_chain(self.chain, record.position, input_digest, output_digest))
        self.records.append(record)

    def signed_after(self, position: int) -> Signed | None:
        """The first signed statement that covers the step ending at `position`."""
        return next((s for s in self.signed if s.position >= position), None)


def verify_signature(
    owner_marker: bytes, session: SessionId, position: int, chain: bytes, signature: bytes
) -> bool:
    """Whether the key in `owner_marker` signed that statement."""
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.utils.crypto import RSAPublicKey

    match = RSASignatureValidator._PUBLIC_KEY_RE.fullmatch(owner_marker)
    if match is None or not signature or len(signature) > MAX_SIGNATURE_BYTES:
        return False
    try:
        key = RSAPublicKey.from_bytes(match.group(1))
        return bool(key.verify(statement(session, position, chain), signature))
    except Exception:  # a malformed key or signature verifies nothing
        return False
