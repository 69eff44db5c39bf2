"""The attack of the `evidence_flood` phase (benchmarks/hostile_evidence.py runs it): one
machine's maximal evidence, to every honest peer at once, as fast as each lets it.

Each request is evidence of the accused's own (a throwaway key's) wrong output, as large as a
re-check may be (FLOOD_SHAPES: 4 x 2,048 tokens first, smaller where a peer will not re-check
that much), padded with a key no reader uses to the 64 MiB a request may hold, with a fresh
output each time (a digest never judged before: a re-check every time it is admitted); then a
GET of one it proved, which pulls the 64 MiB back. Only the 4-byte length prefix goes out
first: the body follows if no refusal came back within PEEK_S, so a refused request costs the
attacker nothing either, and it asks again after PAUSE_S. IN_FLIGHT requests go to each peer
at once, from its identities in turn; it says "attacking" once a body has reached every peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import struct
import threading
from collections import Counter, defaultdict

import torch
from hostile_evidence import code_name

FLOOD_SHAPES = ((4, 2048), (1, 2048), (1, 256))  # batch x tokens: the largest a peer will re-check first
PEEK_S = 0.5  # a refusal of the length prefix comes back within this, or the body goes out
PAUSE_S = 0.25  # after a refusal (RATE_LIMITED, BUSY), before asking again
IN_FLIGHT = 2  # requests to each peer at once (the most one IP group may hold on a peer)
RAMP_S = 120.0  # until a body has reached every peer (then "attacking"), at most


def padded_lie(accused, spec, record, inputs: torch.Tensor, in_digest: bytes, size: int) -> tuple[bytes, str]:
    """Evidence of a wrong output the throwaway `accused` key signed for `record`'s blocks
    (a fresh one each call), padded with a key nobody reads to `size` bytes; and its digest."""
    from hexswarm.client.remote import random_session_id
    from hexswarm.swarm.trust.evidence import Evidence
    from hexswarm.swarm.wire.commitments import (
        SessionId,
        Signed,
        StepRecord,
        next_chain,
        statement,
        tensor_digest,
    )

    output = torch.randn(inputs.shape)
    tokens = inputs.shape[1]
    session = SessionId(spec.model_id, "flood", random_session_id(), record.start, record.end, "float32")
    out_digest = tensor_digest(output)
    chain = next_chain(b"", tokens, in_digest, out_digest)
    signed = Signed(tokens, chain, accused.private_key.sign(statement(session, tokens, chain)))
    record_ = (StepRecord(tokens, in_digest, out_digest),)
    evidence = Evidence(
        session, accused.peer_id.to_base58(), accused.owner_marker, record_, signed, 0, inputs, output
    )
    data = evidence.to_bytes()
    assert data[0] == 0x89  # a map of 9 keys: one more, which readers skip
    pad_key = b"\xa3pad"
    pad_len = max(0, size - len(data) - len(pad_key) - 5)
    return b"\x8a" + data[1:] + pad_key + b"\xc6" + struct.pack(">I", pad_len) + bytes(
        pad_len
    ), evidence.digest()


async def send_once(swarm, peer_id: str, body: bytes, timeout: float, on_body) -> tuple[str, dict]:
    """One request: its length prefix, then (unless refused within PEEK_S) its body, after
    which it calls `on_body()`. (answer, reply)."""
    from hexswarm.swarm.trust.evidence_wire import EVIDENCE_PROTOCOL, MAX_WIRE_EVIDENCE_BYTES, decode_message
    from hexswarm.swarm.wire.frames import read_payload

    reader, writer = await swarm.dialer.open_stream(peer_id, EVIDENCE_PROTOCOL)
    try:
        writer.write(struct.pack(">I", len(body)))
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            reply = decode_message(await asyncio.wait_for(read_payload(reader, 1 << 16), PEEK_S))
            return _answer(reply), reply
        writer.write(body)
        await writer.drain()
        on_body()
        reply = decode_message(
            await asyncio.wait_for(read_payload(reader, MAX_WIRE_EVIDENCE_BYTES + 8192), timeout)
        )
        return _answer(reply), reply
    finally:
        writer.close()


def _answer(reply: dict) -> str:
    return (
        code_name(int(reply.get("code", 0) or 0))
        if "error" in reply
        else str(reply.get("verdict", "evidence"))
    )


async def flood_attack(swarms, targets, spec, args, stop: threading.Event) -> dict:
    import msgpack

    from hexswarm.swarm.net.identity import load_or_create_identity
    from hexswarm.swarm.trust.evidence_wire import MAX_WIRE_EVIDENCE_BYTES
    from hexswarm.swarm.wire.commitments import tensor_digest

    accused = load_or_create_identity(None)
    answers, sent = defaultdict(Counter), Counter()
    shape = {t.peer_id: 0 for t in targets}  # index into FLOOD_SHAPES
    inputs = {s: torch.randn(s[0], s[1], spec.hidden_size) for s in FLOOD_SHAPES}
    digests = {s: tensor_digest(x) for s, x in inputs.items()}
    proven: defaultdict[str, list[str]] = defaultdict(list)  # target -> digests it proved (and keeps)
    size = MAX_WIRE_EVIDENCE_BYTES - 64

    def request(target) -> tuple[bytes, str]:
        s = FLOOD_SHAPES[shape[target.peer_id]]
        data, digest = padded_lie(accused, spec, target, inputs[s], digests[s], size)
        return msgpack.packb({"op": "submit", "evidence": data}, use_bin_type=True), digest

    async def loop(k: int, target) -> None:
        rng = random.Random(f"{k}{target.peer_id}")
        pending = None  # (request, digest): built once (off the loop), sent once admitted
        while not stop.is_set():
            pending = built = pending or await asyncio.to_thread(request, target)
            refused = False
            for kind, body in (("submit", built[0]), ("get", _get(proven[target.peer_id], rng))):
                if body is None:
                    continue

                size = len(body)

                def on_body(kind=kind, size=size) -> None:
                    nonlocal pending
                    sent[f"{kind}_bodies"] += 1
                    sent[f"{kind}_bytes"] += size
                    pending = None if kind == "submit" else pending  # sent: the next one is new

                sent[f"{kind}_started"] += 1  # those still in flight at the end have no answer
                try:
                    swarm = swarms[next(turns) % len(swarms)]  # identities in turn: each has its own rates
                    answer, reply = await send_once(swarm, target.peer_id, body, 180, on_body)
                except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError, ValueError) as e:
                    answer, reply = type(e).__name__, {}
                answers[kind][answer] += 1
                refused |= answer in ("RATE_LIMITED", "BUSY")
                if kind == "get" and answer == "evidence":
                    sent["get_pulled_bytes"] += len(reply["evidence"])
                if kind == "submit" and answer == "proven":
                    proven[target.peer_id].append(built[1])
                if kind == "submit" and _too_large(answer, str(reply.get("error", ""))):
                    shape[target.peer_id] = min(shape[target.peer_id] + 1, len(FLOOD_SHAPES) - 1)
                    pending = None  # build a smaller one
            if refused:
                await asyncio.sleep(PAUSE_S)

    turns = itertools.count()
    loops = [asyncio.ensure_future(loop(k, t)) for k in range(IN_FLIGHT) for t in targets]
    ramp = asyncio.get_running_loop().time() + RAMP_S
    while sent["submit_bodies"] < len(targets) and asyncio.get_running_loop().time() < ramp:
        await asyncio.sleep(0.2)
    print("attacking", flush=True)  # the flood is in full swing: the honest load is measured from here
    while not stop.is_set() and not all(t.done() for t in loops):
        await asyncio.sleep(0.2)
    for task in loops:  # requests in flight are given up
        task.cancel()
    failed = [r for r in await asyncio.gather(*loops, return_exceptions=True) if isinstance(r, Exception)]
    return {
        "identities": len(swarms),
        "request_bytes": size,
        "shapes": {t.name: FLOOD_SHAPES[shape[t.peer_id]] for t in targets},
        "answers": {k: dict(c) for k, c in answers.items()},
        "sent": {k: v for k, v in sent.items() if not k.endswith("_bytes")},
        "sent_mib": {k: round(v / 2**20, 1) for k, v in sent.items() if k.endswith("_bytes")},
        "proven_per_peer": {t.name: len(proven[t.peer_id]) for t in targets},
        "loops_failed": [f"{type(e).__name__}: {e}"[:200] for e in failed],
    }


def _too_large(answer: str, message: str) -> bool:
    """Whether a re-check of this shape is more than the peer takes at all (not only now)."""
    return answer == "TOO_LONG" or any(m in message for m in ("may reserve", "batch size"))


def _get(digests: list[str], rng: random.Random) -> bytes | None:
    import msgpack

    return msgpack.packb({"op": "get", "digest": rng.choice(digests)}) if digests else None
