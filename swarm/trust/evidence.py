"""Evidence of a lie that anyone can re-check: a peer's signed commitments and the inputs.

When a client's verification proves a peer wrong (client/verify.py: a witness and a third peer
agree against it), it asks that peer for a signed statement of the session's steps, if none it
holds covers the wrong step yet (ATTEST; swarm/wire/commitments.py), and keeps:

- the session (model, client, session id, blocks) and the peer's public key;
- every step's commitment up to the signed position (input and output digests) and the signature;
- the inputs the session was sent up to the end of the wrong step, and the output it returned.

`check` makes sure it holds together: the key is the peer id's, the signature signs the chain
of the listed steps, the inputs hash to what the peer committed to, and so does the output.
Then `recheck` recomputes the blocks on those inputs in one prefill-shaped pass: if the
signed output is off by more than the format's tolerance (swarm/trust/verify_tolerance.py), the
peer is proven to have signed a wrong output. A report cannot frame an honest peer, since only
its key can sign its commitments; and re-checking costs one prefill of at most
MAX_EVIDENCE_TOKENS tokens of the span, whoever sends it.

`hexswarm recheck MODEL FILE [--ban]` (peer/recheck_command.py) runs it on a saved file.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import torch

from hexswarm.swarm.net.identity import peer_id_from_owner_marker
from hexswarm.swarm.trust.verify_tolerance import TOLERANCES, Comparison, coarsest, compare
from hexswarm.swarm.wire.commitments import (
    SessionId,
    Signed,
    StepRecord,
    next_chain,
    tensor_digest,
    verify_signature,
)
from hexswarm.swarm.wire.tensors import DTYPE_NAMES, decode_tensor, encode_tensor

EVIDENCE_VERSION = 2
MAX_EVIDENCE_TOKENS = 8192  # batch x tokens of the inputs: the most work a re-check can cost
MAX_EVIDENCE_BYTES = 256 << 20
# Inputs beyond this (any value) prove nothing against a 16-bit float signer: see _beyond_any_model
NARROW_INPUT_LIMIT = 1e6
NARROW_FLOATS = ("float16", "bfloat16")


@dataclass(frozen=True)
class Evidence:
    session: SessionId
    peer_id: str  # the peer that signed a wrong output
    owner_marker: bytes  # its public key
    records: tuple[StepRecord, ...]  # the session's steps up to the signed position
    signed: Signed
    step: int  # index in `records` of the wrong step
    inputs: torch.Tensor  # (batch, tokens up to the wrong step's end, hidden): what the session was sent
    output: torch.Tensor  # what the peer returned for the wrong step

    @property
    def format(self) -> str:
        """The format the output is checked at: the coarser of the one the peer signed it computes
        in and the output's own dtype (both covered by its signature)."""
        return coarsest([self.session.format, DTYPE_NAMES.get(self.output.dtype, "float32")])

    @property
    def first(self) -> int:
        """The wrong step's first position."""
        return self.records[self.step - 1].position if self.step else 0

    def check(self) -> None:
        """Raises ValueError naming what does not hold together."""
        Claim(self.session, self.peer_id, self.owner_marker, self.records, self.signed).check()
        self._check_tensors()

    def _check_tensors(self) -> None:
        if not 0 <= self.step < len(self.records):
            raise ValueError("the wrong step is not one of the steps")
        end = self.records[self.step].position
        if (
            self.inputs.ndim != 3
            or self.inputs.shape[1] != end
            or self.inputs.shape[0] * end > MAX_EVIDENCE_TOKENS
        ):
            raise ValueError(
                f"the inputs must be (batch, {end}, hidden), at most {MAX_EVIDENCE_TOKENS} tokens"
            )
        first = 0
        for record in self.records[: self.step + 1]:
            if tensor_digest(self.inputs[:, first : record.position]) != record.input_digest:
                raise ValueError(
                    f"the inputs of the step ending at {record.position} are not what the peer got"
                )
            first = record.position
        if tensor_digest(self.output) != self.records[self.step].output_digest:
            raise ValueError("the output is not what the peer returned")

    def to_bytes(self) -> bytes:
        body = {
            "v": EVIDENCE_VERSION,
            "session": list(self.session.__dict__.values()),
            "peer_id": self.peer_id,
            "owner_marker": self.owner_marker,
            "records": [[r.position, r.input_digest, r.output_digest] for r in self.records],
            "signed": [self.signed.position, self.signed.chain, self.signed.signature],
            "step": self.step,
            "inputs": encode_tensor(self.inputs),
            "output": encode_tensor(self.output),
        }
        return msgpack.packb(body, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> Evidence:
        """Parses evidence (no pickle); ValueError if it is malformed. Call `check` next."""
        if len(data) > MAX_EVIDENCE_BYTES:
            raise ValueError(f"evidence over {MAX_EVIDENCE_BYTES} bytes")
        try:
            body = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=len(data))
            if not isinstance(body, dict) or body.get("v") != EVIDENCE_VERSION:
                raise ValueError("not hexswarm evidence of a known version")
            return cls(
                **Claim.fields_of(body),
                step=_typed([body["step"]], (int,))[0],
                inputs=decode_tensor(body["inputs"]),
                output=decode_tensor(body["output"]),
            )
        except (KeyError, TypeError, msgpack.UnpackException, ValueError) as e:
            raise ValueError(f"malformed evidence: {e}") from None
        except Exception as e:  # a bad tensor map raises the protocol's typed error
            raise ValueError(f"malformed evidence: {type(e).__name__}: {e}") from None

    def digest(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """What evidence claims, without its tensors: who signed which steps of which session. Read
    from the front of the bytes (`read_claim`) and checked in well under a millisecond, so a
    stranger's forged signature is refused before the inputs are decoded or hashed."""

    session: SessionId
    peer_id: str
    owner_marker: bytes
    records: tuple[StepRecord, ...]
    signed: Signed

    @staticmethod
    def fields_of(body: dict) -> dict[str, Any]:
        """The claim's fields of an unpacked evidence map, typed (KeyError, ValueError if not)."""
        return {
            "session": SessionId(*_typed(body["session"], (str, str, str, int, int, str))),
            "peer_id": _typed([body["peer_id"]], (str,))[0],
            "owner_marker": _typed([body["owner_marker"]], (bytes,))[0],
            "records": tuple(StepRecord(*_typed(r, (int, bytes, bytes))) for r in body["records"]),
            "signed": Signed(*_typed(body["signed"], (int, bytes, bytes))),
        }

    def check(self) -> None:
        """Raises ValueError unless the peer's key signed these steps of this session."""
        if self.session.format not in TOLERANCES:
            raise ValueError(f"unknown format {self.session.format[:32]!r}")
        if peer_id_from_owner_marker(self.owner_marker).to_base58() != self.peer_id:
            raise ValueError("the public key is not the peer's")
        if not self.records or self.records[-1].position != self.signed.position:
            raise ValueError("the steps do not end where the signed statement does")
        chain = b""
        for record in self.records:
            chain = next_chain(chain, record.position, record.input_digest, record.output_digest)
        if chain != self.signed.chain:
            raise ValueError("the steps do not hash to the signed chain")
        if not verify_signature(
            self.owner_marker, self.session, self.signed.position, chain, self.signed.signature
        ):
            raise ValueError("the peer's signature does not verify")


_CLAIM_KEYS = ("v", "session", "peer_id", "owner_marker", "records", "signed")


def read_claim(data: bytes) -> Claim:
    """The claim of evidence `data`, unpacked field by field from its front and skipping the
    tensors (to_bytes writes them last); ValueError if it is malformed."""
    if len(data) > MAX_EVIDENCE_BYTES:
        raise ValueError(f"evidence over {MAX_EVIDENCE_BYTES} bytes")
    unpacker = msgpack.Unpacker(
        io.BytesIO(data),  # shares `data`'s buffer: read as far as the claim goes, no further
        raw=False,
        strict_map_key=True,
        max_bin_len=len(data),
        max_buffer_size=max(len(data), 1 << 16),
    )
    body: dict[str, Any] = {}
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if isinstance(key, str) and key in _CLAIM_KEYS:
                body[key] = unpacker.unpack()
            else:
                unpacker.skip()
            if len(body) == len(_CLAIM_KEYS):
                break
        if body.get("v") != EVIDENCE_VERSION:
            raise ValueError("not hexswarm evidence of a known version")
        return Claim(**Claim.fields_of(body))
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as e:
        raise ValueError(f"malformed evidence: {e}") from None


def _typed(values: Any, kinds: tuple[type, ...]) -> list:
    if not isinstance(values, list) or len(values) != len(kinds):
        raise ValueError(f"expected {len(kinds)} fields")
    for value, kind in zip(values, kinds, strict=True):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")
    return values


def recheck(evidence: Evidence, outputs: torch.Tensor, recomputed_in: str | None = None) -> Comparison:
    """`outputs`: the blocks recomputed on `evidence.inputs` (one pass over every token), in the
    format `recomputed_in` (the evidence's own if None). The comparison disagrees when the
    signed output is wrong, at the tolerance of the coarser of the two formats."""
    ours = outputs[:, evidence.first : evidence.records[evidence.step].position]
    if ours.shape != evidence.output.shape:
        raise ValueError(
            f"recomputed {tuple(ours.shape)}, the signed output is {tuple(evidence.output.shape)}"
        )
    if evidence.format in NARROW_FLOATS and _beyond_any_model(evidence):
        return Comparison(0, float("nan"), float("nan"), float("nan"), True)  # nothing proven
    fmt = coarsest([evidence.format, recomputed_in or evidence.format])
    if evidence.format in NARROW_FLOATS:
        ours = _overflowing_as_unjudged(ours, getattr(torch, evidence.format))
    return compare(evidence.output, ours.to(evidence.output.dtype), TOLERANCES[fmt])


def _overflowing_as_unjudged(ours: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The recomputation with every token that comes within half of `dtype`'s largest value set
    to inf: an honest computation in that format saturates or overflows there (its largest
    dimensions, which the comparison ranks, all sit at the format's maximum), so such tokens are
    left out as `compare` leaves out overflow on both sides. A liar on sane inputs gains nothing:
    it is the true values that decide, not what it served."""
    near = ours.float().abs().amax(dim=-1, keepdim=True) >= torch.finfo(dtype).max / 2
    return torch.where(near, torch.full_like(ours, float("inf")), ours)


def _beyond_any_model(evidence: Evidence) -> bool:
    """Whether the inputs up to the signed output hold a value no model's hidden states reach.
    On such inputs a 16-bit float computation can honestly end in NaN or saturate where the
    float32 recomputation stays finite, so it proves nothing; an honest client never sends them
    (SmolLM2's largest hidden values are ~2e4; attention mixes every earlier token in)."""
    end = evidence.records[evidence.step].position
    return bool(evidence.inputs[:, :end].float().abs().amax() > NARROW_INPUT_LIMIT)


def evidence_dir() -> Path:
    from hexswarm.swarm.trust.bans import bans_path

    return bans_path().parent / "evidence"


def received_evidence_dir() -> Path:
    """Where a peer keeps evidence that remotes sent it and it proved (peer/evidence_service.py):
    apart from what this machine's own clients proved (`evidence_dir`), so that pruning what
    strangers send never removes the operator's own."""
    return evidence_dir().with_name("evidence-received")


def save_evidence(evidence: Evidence, keep: int | None = None, folder: Path | None = None) -> Path:
    """Saves `evidence` in `folder` (the cache folder's evidence/ by default); with `keep`, only
    the newest `keep` files of that folder stay (a peer saves what strangers prove to it, in
    `received_evidence_dir()`, and must not fill its disk with it)."""
    from hexswarm.swarm.tools.cache_files import write_atomically

    path = (folder or evidence_dir()) / f"{evidence.digest()}.msgpack"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, evidence.to_bytes())
    if keep is not None:
        files = sorted(path.parent.glob("*.msgpack"), key=lambda f: f.stat().st_mtime, reverse=True)
        for old in files[keep:]:
            old.unlink(missing_ok=True)
    return path
