"""A peer's evidence service (peer/evidence_service.py) on a real PeerCore and compute thread:
it bans on evidence it proved itself, clears an honest peer, says when it cannot tell, refuses
what does not hold together, and rate-limits each remote."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import pytest

from hexswarm.peer.evidence_service import EvidenceLimits, EvidenceService
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.trust.bans import load_bans
from hexswarm.swarm.trust.evidence_wire import CANNOT_CHECK, NOT_PROVEN, PROVEN, Holding
from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError
from tests.unit.test_evidence import _evidence, _signing_server, identity, spec  # noqa: F401 (fixtures)

REMOTE = "QmSubmitter"


class _Dht:
    """Keeps what the service stores (the DHT's own signing and replication are hivemind's)."""

    def __init__(self):
        self.stored = []

    def store(self, key, value, expiration, subkey=None, return_future=False):
        self.stored.append((key, subkey, value))
        future = concurrent.futures.Future()
        future.set_result(True)
        return future


async def _same_group(remote: str) -> str:
    return "one-group"


def _service(spec, limits=None) -> EvidenceService:  # noqa: F811
    server = _signing_server(spec, load_or_create_identity(None))
    own = load_or_create_identity(None)  # not the liar
    return EvidenceService(server.core, server.scheduler, _Dht(), own, "float32", _same_group, limits)


@pytest.mark.asyncio
async def test_a_proven_lie_bans_the_liar_and_is_kept_and_announced(spec, identity):  # noqa: F811
    service = _service(spec)
    evidence, _ = _evidence(spec, identity, 0.05)
    reply = await service.answer({"op": "submit", "evidence": evidence.to_bytes()}, REMOTE)
    assert reply["verdict"] == PROVEN, reply
    assert evidence.peer_id in service.banned and evidence.peer_id in load_bans()
    ((key, subkey, value),) = service.dht.stored
    holding = Holding.from_bytes(value)
    assert (holding.liar, holding.digest) == (evidence.peer_id, evidence.digest())
    assert subkey.startswith(service.identity.owner_marker)
    got = await service.answer({"op": "get", "digest": evidence.digest()}, "QmReader")
    assert got["evidence"] == evidence.to_bytes()
    again = await service.answer({"op": "submit", "evidence": evidence.to_bytes()}, "QmOther")
    assert again == reply and len(service.dht.stored) == 1  # judged once
    assert not service.core.sessions  # the re-check's session is gone
    service.scheduler.stop()


@pytest.mark.asyncio
async def test_an_honest_output_is_not_proven_and_nothing_is_kept(spec):  # noqa: F811
    service = _service(spec)
    evidence, _ = _evidence(spec, load_or_create_identity(None), 0.0)  # an honest peer
    reply = await service.answer({"op": "submit", "evidence": evidence.to_bytes()}, REMOTE)
    assert reply["verdict"] == NOT_PROVEN and not service.dht.stored
    assert evidence.peer_id not in service.banned | set(load_bans())
    with pytest.raises(ProtocolError, match="no such evidence"):
        await service.answer({"op": "get", "digest": evidence.digest()}, REMOTE)
    service.scheduler.stop()


@pytest.mark.asyncio
async def test_evidence_about_blocks_or_formats_it_does_not_serve_is_not_judged(spec, identity):  # noqa: F811
    service = _service(spec)
    evidence, _ = _evidence(spec, identity, 0.05)
    service.own_format = "int8"
    reply = await service.answer({"op": "submit", "evidence": evidence.to_bytes()}, REMOTE)
    assert reply["verdict"] == CANNOT_CHECK and not service.dht.stored
    other_model = dataclasses.replace(
        evidence, session=dataclasses.replace(evidence.session, model_id="other")
    )
    reply = await service.answer({"op": "submit", "evidence": other_model.to_bytes()}, REMOTE)
    assert reply["verdict"] == CANNOT_CHECK
    service.scheduler.stop()


@pytest.mark.asyncio
async def test_tampered_evidence_is_refused_and_one_remote_is_rate_limited(spec, identity):  # noqa: F811
    service = _service(spec, EvidenceLimits(submits_per_minute_per_remote=1.0))
    evidence, _ = _evidence(spec, identity, 0.05)
    codes = []
    for i in range(4):
        tampered = dataclasses.replace(evidence, output=evidence.output + i + 1)
        try:
            await service.answer({"op": "submit", "evidence": tampered.to_bytes()}, REMOTE)
        except ProtocolError as e:
            codes.append(e.code)
    assert codes == [ErrorCode.MALFORMED, ErrorCode.MALFORMED, ErrorCode.RATE_LIMITED, ErrorCode.RATE_LIMITED]
    reply = await service.answer({"op": "submit", "evidence": evidence.to_bytes()}, "QmAnotherRemote")
    assert reply["verdict"] == PROVEN  # another remote (of a group under its limit) is served
    with pytest.raises(ProtocolError) as e:  # over its rate: refused before anything is parsed
        await service.answer({"op": "submit", "evidence": b"\x00garbage"}, REMOTE)
    assert e.value.code == ErrorCode.RATE_LIMITED
    with pytest.raises(ProtocolError) as e:
        await service.answer({"op": "submit", "evidence": b"\x00garbage"}, "QmThird")
    assert e.value.code == ErrorCode.MALFORMED
    service.scheduler.stop()
