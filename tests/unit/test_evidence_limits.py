"""What a stranger's evidence request may cost a peer before any limit applies (issue 49, item 8):
the size and a slot are taken before the body is read, the rates (per remote and per IP group)
before anything is parsed, a signature check before the tensors are decoded, the heavy parse and
digest off the serving event loop; fetches are limited per IP group too; and what remotes prove
to the peer never prunes the evidence its operator's own client collected."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import struct
import threading
from types import SimpleNamespace

import msgpack
import pytest

from hexswarm.peer import evidence_service
from hexswarm.peer.evidence_gate import LARGEST_SUBMISSION, SUBMIT, EvidenceGate
from hexswarm.peer.evidence_service import EvidenceLimits, EvidenceService
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.trust.evidence import Evidence, read_claim, save_evidence
from hexswarm.swarm.trust.evidence_wire import PROVEN, encode_message
from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError
from tests.unit.test_evidence import _evidence, _signing_server, identity, spec  # noqa: F401 (fixtures)
from tests.unit.test_evidence_service import _Dht

BIG = 32 << 20  # an announced evidence request: 32 MiB


class _Writer:
    def __init__(self):
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def reply(self) -> dict | None:
        return msgpack.unpackb(bytes(self.data[4:])) if self.data else None


def _service(spec, groups: dict[str, str | None], limits=None) -> EvidenceService:  # noqa: F811
    async def group_of(remote: str) -> str | None:
        return groups.get(remote, remote)

    server = _signing_server(spec, load_or_create_identity(None))
    own = load_or_create_identity(None)
    return EvidenceService(server.core, server.scheduler, _Dht(), own, "float32", group_of, limits)


def _announce(service: EvidenceService, remote: str, size: int, body: bytes = b""):
    """A request stream from `remote` that announces `size` bytes and sends `body` of them."""
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">I", size) + body)
    writer = _Writer()
    info = SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda: remote))
    return asyncio.create_task(service.handle_stream(info, reader, writer)), reader, writer


async def _settle(tasks, seconds: float = 0.5) -> None:
    await asyncio.wait(tasks, timeout=seconds)


@pytest.fixture
def parsed(monkeypatch) -> list:
    """One entry per full parse of evidence (Evidence.from_bytes), which still runs as before."""
    calls = []
    real = Evidence.from_bytes.__func__
    monkeypatch.setattr(Evidence, "from_bytes", classmethod(lambda cls, d: calls.append(1) or real(cls, d)))
    return calls


@pytest.mark.asyncio
async def test_announced_bodies_take_a_bounded_number_of_slots_before_they_are_read(spec):  # noqa: F811
    groups = {f"QmBig{i}": f"group-{i}" for i in range(6)} | {"QmSame0": "g", "QmSame1": "g", "QmSame2": "g"}
    service = _service(spec, groups)
    streams = [_announce(service, remote, BIG) for remote in groups]
    await _settle([task for task, _, _ in streams])
    busy = [w for _, _, w in streams if w.reply() and w.reply()["code"] == ErrorCode.BUSY]
    reading = [task for task, _, _ in streams if not task.done()]
    # never more bodies read at once than the slots, and a group holds at most its share
    assert len(reading) <= 4 and len(busy) == len(streams) - len(reading), (len(reading), len(busy))
    same = [
        t for (t, _, _), r in zip(streams, groups, strict=True) if r.startswith("QmSame") and not t.done()
    ]
    assert len(same) <= 2
    for task in reading:
        task.cancel()
    await asyncio.gather(*reading, return_exceptions=True)
    # the slots are given back when a stream ends: a later request is read again
    task, _, writer = _announce(service, "QmLater", 10, b"\x00" * 10)
    await _settle([task])
    assert task.done() and writer.reply()["code"] == ErrorCode.MALFORMED
    service.scheduler.stop()


@pytest.mark.asyncio
async def test_a_remote_over_its_rate_is_refused_before_its_body_is_read_or_parsed(spec, parsed):  # noqa: F811
    service = _service(spec, {}, EvidenceLimits(submits_per_minute_per_remote=1.0))
    for _ in range(2):  # the burst: two minutes' worth
        with pytest.raises(ProtocolError) as e:
            await service.answer({"op": "submit", "evidence": b"\x00garbage"}, "QmFlood")
        assert e.value.code == ErrorCode.MALFORMED
    parsed.clear()
    with pytest.raises(ProtocolError) as e:
        await service.answer({"op": "submit", "evidence": b"\x00garbage"}, "QmFlood")
    assert e.value.code == ErrorCode.RATE_LIMITED and not parsed
    task, _, writer = _announce(service, "QmFlood", BIG)  # a 32 MiB body it never has to read
    await _settle([task])
    assert task.done() and writer.reply()["code"] == ErrorCode.RATE_LIMITED
    service.scheduler.stop()


@pytest.mark.asyncio
async def test_one_ip_group_is_rate_limited_before_parsing_whatever_its_identities(spec, parsed):  # noqa: F811
    sybils = {f"QmSybil{i}": "one-home" for i in range(20)}
    service = _service(spec, sybils)
    codes = []
    for remote in sybils:
        try:
            await service.answer({"op": "submit", "evidence": b"\x00garbage"}, remote)
        except ProtocolError as e:
            codes.append(e.code)
    limited = codes.count(ErrorCode.RATE_LIMITED)
    assert limited == 20 - 12 and len(parsed) <= 12, (codes, len(parsed))  # 6 a minute, bursts of 12
    service.scheduler.stop()


@pytest.mark.asyncio
async def test_a_bad_signature_is_refused_before_the_tensors_are_decoded_and_parsing_is_off_the_loop(
    spec,  # noqa: F811
    identity,  # noqa: F811
    monkeypatch,
):
    loop_thread = threading.get_ident()
    threads = []
    real = Evidence.from_bytes.__func__
    monkeypatch.setattr(
        Evidence,
        "from_bytes",
        classmethod(lambda cls, d: threads.append(threading.get_ident()) or real(cls, d)),
    )
    service = _service(spec, {})
    evidence, _ = _evidence(spec, identity, 0.05)
    forged = dataclasses.replace(evidence, signed=dataclasses.replace(evidence.signed, signature=b"\0" * 256))
    with pytest.raises(ProtocolError, match="signature") as e:
        await service.answer({"op": "submit", "evidence": forged.to_bytes()}, "QmForger")
    assert e.value.code == ErrorCode.MALFORMED and not threads  # refused on the signature alone
    reply = await service.answer({"op": "submit", "evidence": evidence.to_bytes()}, "QmHonest")
    assert reply["verdict"] == PROVEN
    assert threads and loop_thread not in threads  # the full parse ran on a worker thread
    service.scheduler.stop()


@pytest.mark.asyncio
async def test_fetches_are_limited_per_ip_group_too(spec, tmp_path):  # noqa: F811
    sybils = {f"QmReader{i}": "one-home" for i in range(30)}
    service = _service(spec, sybils)
    service.kept["ab" * 32] = tmp_path / "kept.msgpack"
    service.kept["ab" * 32].write_bytes(b"kept evidence")
    codes = []
    for remote in sybils:  # each identity asks once: a per-identity limit never bites
        task, _, writer = _announce(service, remote, *_request({"op": "get", "digest": "ab" * 32}))
        await task
        codes.append(writer.reply().get("code", 0))
    assert codes.count(ErrorCode.RATE_LIMITED) >= 6 and codes.count(0) <= 24, codes
    service.scheduler.stop()


def _request(body: dict) -> tuple[int, bytes]:
    payload = encode_message(body)[4:]
    return len(payload), payload


@pytest.mark.asyncio
async def test_what_remotes_prove_never_prunes_the_operators_own_evidence(spec, identity, monkeypatch):  # noqa: F811
    own, _ = _evidence(spec, identity, 0.05)
    own_path = save_evidence(own)  # what this machine's own client proved
    os.utime(own_path, (1.0, 1.0))  # the oldest file there is
    monkeypatch.setattr(evidence_service, "MAX_KEPT", 1)
    service = _service(spec, {})
    for i in range(2):
        evidence, _ = _evidence(spec, identity, 0.05 + i / 100)
        reply = await service.answer({"op": "submit", "evidence": evidence.to_bytes()}, f"QmProver{i}")
        assert reply["verdict"] == PROVEN
    assert own_path.exists(), "a remote's submissions pruned the operator's own evidence"
    service.scheduler.stop()


def test_the_gate_counts_nothing_for_a_refusal_and_gives_slots_back():
    gate = EvidenceGate(EvidenceLimits(submits_per_minute_per_remote=1.0, max_held=1))
    gate.admit(SUBMIT, "QmA", "g", 0.0)
    with pytest.raises(ProtocolError) as e:  # the one slot is held: BUSY, and QmB's token is not spent
        gate.admit(SUBMIT, "QmB", None, 0.0)
    assert e.value.code == ErrorCode.BUSY
    gate.release("g")
    gate.admit(SUBMIT, "QmB", None, 0.0)
    gate.release(None)
    gate.admit(SUBMIT, "QmB", None, 0.0)  # its burst of two, both spent on admitted requests
    gate.release(None)
    with pytest.raises(ProtocolError) as e:
        gate.admit(SUBMIT, "QmB", None, 0.0)
    assert e.value.code == ErrorCode.RATE_LIMITED and not gate.held


def test_submission_bytes_are_budgeted_per_ip_group_and_in_total_before_a_body_is_read():
    """The count rates let one machine send 6 maximal submissions a minute to each peer; the
    bytes budget lets a group send two at once, then one a minute, and all strangers four."""
    gate = EvidenceGate(EvidenceLimits(submits_per_minute_per_remote=60, submits_per_minute_per_group=60))

    def submit(
        remote: str, group: str | None, now: float, size: int = LARGEST_SUBMISSION
    ) -> ErrorCode | None:
        try:
            gate.admit(SUBMIT, remote, group, now, size)
        except ProtocolError as e:
            return e.code
        gate.release(group)
        return None

    assert [submit(f"QmA{i}", "home-a", 0.0) for i in range(3)] == [None, None, ErrorCode.RATE_LIMITED]
    assert submit("QmLoop0", None, 0.0) is None  # no group (loopback): per remote
    assert submit("QmLoop1", None, 0.0) is None
    assert submit("QmB0", "home-b", 0.0) == ErrorCode.BUSY  # all strangers: four maximal bodies
    assert submit("QmB0", "home-b", 0.0, 1 << 20) == ErrorCode.BUSY  # nothing was taken for a refusal
    assert submit("QmB0", "home-b", 30.0) is None  # half a minute refills one
    assert submit("QmA0", "home-a", 30.0) == ErrorCode.RATE_LIMITED  # its group's: a minute
    assert submit("QmA0", "home-a", 90.0) is None


def test_fetched_bytes_are_budgeted_per_ip_group_and_in_total_before_a_file_is_read():
    """A ~100-byte GET pulls up to 64 MiB back: the same budgets as submissions bound it."""
    gate = EvidenceGate(EvidenceLimits())

    def fetch(remote: str, group: str | None, now: float) -> ErrorCode | None:
        try:
            gate.take_sent(remote, group, LARGEST_SUBMISSION, now)
        except ProtocolError as e:
            return e.code
        return None

    assert [fetch(f"QmA{i}", "home-a", 0.0) for i in range(3)] == [None, None, ErrorCode.RATE_LIMITED]
    assert [fetch(f"QmB{i}", "home-b", 0.0) for i in range(2)] == [None, None]
    assert fetch("QmC0", "home-c", 0.0) == ErrorCode.BUSY  # all strangers: four of the largest
    assert fetch("QmC0", "home-c", 30.0) is None and fetch("QmA0", "home-a", 30.0) == ErrorCode.RATE_LIMITED


def test_the_claim_is_read_without_the_tensors(spec, identity):  # noqa: F811
    evidence, _ = _evidence(spec, identity, 0.05)
    claim = read_claim(evidence.to_bytes())
    assert (claim.session, claim.peer_id, claim.signed) == (
        evidence.session,
        evidence.peer_id,
        evidence.signed,
    )
    claim.check()
    for garbage in (b"", b"\xc1", b"\x93\x01\x02\x03", b"\x81\xa1v\x07", msgpack.packb({"v": 2})):
        with pytest.raises(ValueError):
            read_claim(garbage)
