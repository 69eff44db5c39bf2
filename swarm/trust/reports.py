"""Signed reports of peers whose outputs failed a client's verification (client/verify.py).

Layout (one DHT key per model; each report under a subkey protected by the reporter's key):

    hexswarm/v1/reports/<model_id>   subkey [owner:<reporter's public key>]/<reported peer id>
                                     ->  msgpack Report

hivemind's RSASignatureValidator makes every DHT node refuse a report not signed by the key
named in its subkey, so a report cannot be forged in another client's name, and one reporter
has one report per reported peer. A report is kept by readers only if it names its evidence:
the hash of the step's input and the two output hashes that disagree. Reports are claims of
one client, not proofs: `hexswarm status` lists them with how many reporters agree.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

import msgpack
import torch

from hexswarm.swarm.net.dht_read import get_latest
from hexswarm.swarm.trust.records import parse_signed_entries, unpack_map
from hexswarm.swarm.wire.tensors import hash_tensor

logger = logging.getLogger(__name__)

REPORT_SCHEMA_VERSION = 1
REPORTS_KEY = "hexswarm/v1/reports"
REPORT_TTL_S = 24 * 3600.0
_HASH = re.compile(r"[0-9a-f]{64}")
_OWNER = re.compile(rb"\[owner:.+?\]")


def reports_key(model_id: str) -> str:
    return f"{REPORTS_KEY}/{model_id}"


def tensor_hash(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes: what a report names as evidence."""
    return hash_tensor(tensor, hashlib.sha256()).hexdigest()


@dataclass(frozen=True)
class Report:
    """One client's claim that `reported` returned a wrong output for blocks [start, end)."""

    reporter: str  # base58 id of the key that signed the report (checked by readers)
    reported: str  # peer id whose output was judged wrong
    model_id: str
    start: int
    end: int
    position: int  # the step's position in the session
    input_hash: str  # the evidence: the step's input ...
    reported_output_hash: str  # ... what the reported peer returned ...
    witness: str  # ... and the peer that disagreed with it,
    witness_output_hash: str  # with what it returned
    max_abs_diff: float
    tie_breaker: str = ""  # a third peer that agreed with the witness ("" if none was asked)
    time: float = 0.0  # DHT time of the report
    # sha256 of the reporter's evidence file (swarm/trust/evidence.py: the peer's signed commitments
    # and the inputs, which `hexswarm recheck` re-checks); "" if the peer signed nothing
    evidence: str = ""
    schema: int = REPORT_SCHEMA_VERSION

    def to_bytes(self) -> bytes:
        return msgpack.packb(asdict(self), use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: Any) -> Report:
        """Parses a report; raises ValueError if it is malformed or names no evidence."""
        body = unpack_map(data, max_bytes=8 * 1024)
        if body.get("schema") != REPORT_SCHEMA_VERSION:
            raise ValueError("report is not of the known schema")
        known = {f.name: body[f.name] for f in fields(cls) if f.name in body}
        try:
            report = cls(**known)
        except TypeError as e:
            raise ValueError(f"malformed report: {e}") from None
        report.check()
        return report

    def check(self) -> None:
        for name in ("reporter", "reported", "model_id", "witness", "tie_breaker", "evidence"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"report field {name} is not a string")
        for name in ("start", "end", "position"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"report field {name} is not an int")
        hashes = (self.input_hash, self.reported_output_hash, self.witness_output_hash)
        if not all(isinstance(h, str) and _HASH.fullmatch(h) for h in hashes):
            raise ValueError("a report must name the input hash and both output hashes")
        if self.reported_output_hash == self.witness_output_hash or self.reported == self.witness:
            raise ValueError("a report's two outputs must come from two peers and differ")
        if not 0 <= self.start < self.end:
            raise ValueError("bad layer range")


def report_subkey(owner_marker: bytes, reported: str) -> bytes:
    return owner_marker + b"/" + reported.encode()


def publish_report(dht, owner_marker: bytes, report: Report, expiration: float):
    """Stores `report` signed by the key of `owner_marker` (the caller's DHT validator key);
    returns hivemind's future."""
    return dht.store(
        reports_key(report.model_id),
        report.to_bytes(),
        expiration,
        subkey=report_subkey(owner_marker, report.reported),
        return_future=True,
    )


def read_reports(dht, model_id: str, timeout: float | None = None) -> list[Report]:
    """Every well-formed report of `model_id` whose reporter is the key that signed it; none (logged)
    if the DHT does not answer within `timeout` seconds (swarm.net.dht_read.DHT_READ_TIMEOUT_S)."""
    value = get_latest(dht, reports_key(model_id), timeout)
    reports = []
    for owner, report in parse_signed_entries(value, Report.from_bytes, _owner_prefix):
        if report.reporter != owner or report.model_id != model_id:
            logger.debug("skipping a report by %s signed by %s", report.reporter, owner)
            continue
        reports.append(report)
    return reports


def _owner_prefix(subkey: bytes) -> bytes:
    """The owner marker that starts a report's subkey (`report_subkey`); ValueError if none."""
    marker = _OWNER.match(subkey)
    if marker is None:
        raise ValueError("report subkey has no owner marker")
    return marker.group(0)
