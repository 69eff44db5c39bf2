"""Signed commitments (swarm/wire/commitments.py) and evidence anyone can re-check (swarm/trust/evidence.py):
a real PeerServer signs its sessions' steps, and a wrong output it signed is proven by
recomputing it; a tampered file proves nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.server import PeerServer
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.trust.evidence import Evidence, recheck
from hexswarm.swarm.wire.commitments import (
    SIGN_EVERY,
    CommitmentLog,
    SessionId,
    Signed,
    tensor_digest,
    verify_signature,
)
from hexswarm.swarm.wire.protocol import Attest, Attested, Open, Opened, Step, StepResult
from tests.unit.test_push import HIDDEN, Stream

CLIENT = "QmClient"


@pytest.fixture(scope="module")
def spec(make_model):
    return load_model_spec(make_model(arch="llama", layers=2, hidden=HIDDEN))


@pytest.fixture(scope="module")
def identity():
    return load_or_create_identity(None)


def _signing_server(spec, identity) -> PeerServer:
    blocks = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    core = PeerCore(blocks, spec.model_id, PeerLimits(max_sessions=2, max_length=128, max_batch=1))
    server = PeerServer(core, 1 << 22, max_streams=4)
    server.signer, server.format = identity, "float32"
    return server


@pytest.mark.asyncio
async def test_a_peer_signs_its_sessions_commitments_every_64_steps_and_when_asked(spec, identity):
    server = _signing_server(spec, identity)
    client = Stream(server, CLIENT)
    opened = await client.ask(Open("s", spec.model_id, 0, 2, 128, 1, "float32"))
    assert isinstance(opened, Opened) and opened.owner_marker == identity.owner_marker
    assert opened.format == "float32"  # what its signed statements name
    log = CommitmentLog(SessionId(spec.model_id, CLIENT, "s", 0, 2, "float32"))
    signatures = []
    for position in range(SIGN_EVERY + 3):
        hidden = torch.randn(1, 1, HIDDEN)
        result = await client.ask(Step("s", position, hidden))
        assert isinstance(result, StepResult) and result.digest == tensor_digest(hidden)
        log.add(1, result.digest, tensor_digest(result.hidden))
        if result.signature:
            signatures.append(log.position)
            assert verify_signature(
                opened.owner_marker, log.session, log.position, log.chain, result.signature
            )
    assert signatures == [SIGN_EVERY]
    attested = await client.ask(Attest("s"))
    assert isinstance(attested, Attested) and attested.position == SIGN_EVERY + 3
    assert verify_signature(
        opened.owner_marker, log.session, attested.position, log.chain, attested.signature
    )
    other = dataclasses.replace(log.session, owner="QmSomeoneElse")  # a statement is about one client
    assert not verify_signature(opened.owner_marker, other, attested.position, log.chain, attested.signature)
    await client.end()
    server.close()


def _evidence(
    spec,
    identity,
    lie: float,
    fmt: str = "float32",
    scale: float = 1.0,
    nan: bool = False,
    saturate: bool = False,
) -> tuple[Evidence, torch.Tensor]:
    """A session of three steps on blocks [0:2); the third one's output off by `lie` (or NaN),
    signed as computed in `fmt`; the inputs times `scale`."""
    stack = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    inputs = scale * torch.randn(1, 7, HIDDEN, generator=torch.Generator().manual_seed(1))
    cache = stack.new_cache("s")
    log = CommitmentLog(SessionId(spec.model_id, CLIENT, "s", 0, 2, fmt))
    with torch.inference_mode():
        for first, end in ((0, 5), (5, 6), (6, 7)):
            output = stack(inputs[:, first:end], cache, first, 0, 2)
            if end == 7:
                output = output + lie * output.std() * torch.randn_like(output)
                output = torch.full_like(output, float("nan")) if nan else output
                output = output.sign() * 65504.0 if saturate else output  # float16's largest value
            log.add(end - first, tensor_digest(inputs[:, first:end]), tensor_digest(output))
        full = stack(inputs, stack.new_cache("w"), 0, 0, 2)
    from hexswarm.swarm.wire.commitments import statement

    signature = identity.private_key.sign(statement(log.session, log.position, log.chain))
    evidence = Evidence(
        log.session,
        identity.peer_id.to_base58(),
        identity.owner_marker,
        tuple(log.records),
        Signed(log.position, log.chain, signature),
        2,
        inputs,
        output,
    )
    return evidence, full


def test_a_16_bit_format_fed_inputs_beyond_any_model_proves_nothing(spec, identity):
    """bfloat16 arithmetic on inputs no model produces can honestly end in NaN where float32's
    stays finite (issue 49's hostile run banned such signers); the same NaN on sane inputs, or
    signed as float32, is proven wrong."""
    huge, full = _evidence(spec, identity, 0.0, fmt="bfloat16", scale=1e30, nan=True)
    assert recheck(huge, full).agree
    sane, full = _evidence(spec, identity, 0.0, fmt="bfloat16", nan=True)
    assert not recheck(sane, full).agree
    as_float32, full = _evidence(spec, identity, 0.0, fmt="float32", scale=1e30, nan=True)
    assert not recheck(as_float32, full).agree


def test_a_float16_signer_saturating_where_the_true_values_overflow_proves_nothing(spec, identity):
    """float16 on inputs near its largest value saturates honestly: its outputs sit at 65504 in
    every large dimension, so the ranking the comparison checks means nothing (issue 49's hostile
    run banned such a signer). The same saturated output on sane inputs is a lie."""
    near_max, full = _evidence(spec, identity, 0.0, fmt="float16", scale=6e4, saturate=True)
    assert recheck(near_max, full).agree
    sane, full = _evidence(spec, identity, 0.0, fmt="float16", saturate=True)
    assert not recheck(sane, full).agree


def test_signed_wrong_output_is_proven_and_an_honest_one_is_not(spec, identity):
    lie, full = _evidence(spec, identity, 0.05)
    lie = Evidence.from_bytes(lie.to_bytes())  # as read back from its file
    lie.check()
    assert not recheck(lie, full).agree
    honest, full = _evidence(spec, identity, 0.0)
    honest.check()
    assert recheck(honest, full).agree


@pytest.mark.parametrize(
    "tamper, why",
    [
        (lambda e: dataclasses.replace(e, output=e.output + 1), "the output is not what the peer returned"),
        (lambda e: dataclasses.replace(e, inputs=e.inputs * 2), "are not what the peer got"),
        (
            lambda e: dataclasses.replace(e, signed=dataclasses.replace(e.signed, signature=b"\0" * 256)),
            "signature does not verify",
        ),
        (
            lambda e: dataclasses.replace(e, records=e.records[:-1]),
            "do not end where the signed statement does",
        ),
        (lambda e: dataclasses.replace(e, peer_id="QmSomebodyElse"), "not the peer's"),
        (lambda e: dataclasses.replace(e, step=9), "not one of the steps"),
        # the format sets the tolerance: the peer signed the one it computes in, nobody else chooses it
        (
            lambda e: dataclasses.replace(e, session=dataclasses.replace(e.session, format="bfloat16")),
            "signature does not verify",
        ),
    ],
)
def test_tampered_evidence_proves_nothing(spec, identity, tamper, why):
    evidence, _ = _evidence(spec, identity, 0.05)
    with pytest.raises(ValueError, match=why):
        tamper(evidence).check()


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\x81\xa1v\x07"])
def test_garbage_is_not_evidence(data):
    with pytest.raises(ValueError):
        Evidence.from_bytes(data)


def test_a_log_records_each_step_from_where_it_starts():
    """A speculative pass rolls back: its record ends where the peer's session then ends, as the
    chain the peer signs says, and the log knows it can no longer back evidence."""
    log = CommitmentLog(SessionId("model", CLIENT, "s", 0, 2, "float32"))
    digest = bytes(8)
    log.add(10, digest, digest)
    log.add(5, digest, digest)  # drafts: ends at 15
    assert (log.position, log.rolled_back) == (15, False)
    log.add(3, digest, digest, start=12)  # two drafts rejected: the peer cut its cache at 12
    assert (log.position, log.rolled_back) == (15, True)
    assert [r.position for r in log.records] == [10, 15, 15]
