"""The evidence phases of benchmarks/hostile.py, and their attacker (run as a process of its own).

    python benchmarks/hostile_evidence.py format|flood --initial-peers ... --model M --targets h0 h1 --out FILE

- `evidence_format`: honest peers framed with their own signatures. From --identities p2p
  identities, the attacker opens a session on every honest peer (over the blocks it shares with
  another honest peer, its judge), steps it four times, asks for its signed statement (ATTEST),
  and submits what an evidence file of each step would hold to the judge: as signed, and with
  every field it can change altered (the session's format to each other one, its owner, id and
  blocks, the output's dtype, the records cut short, the accused's peer id). Also sessions whose
  inputs are huge but finite (outputs that overflow), and outputs of honest bfloat16 and float16
  stacks of its own (an honest peer of another format, with a key of its own) submitted to the
  float32 peers as signed and relabelled float32 (all made before it says "attacking": the
  honest load measures the submissions). Honest outputs must never be "proven" wrong:
  the bench counts honest peers in the machine's bans file (every peer of this run shares it)
  and holdings announced against them (`honest_banned`, goal 0).
- `evidence_flood`: one machine's maximal evidence (benchmarks/hostile_evidence_flood.py), from
  3 identities: 6 submissions a minute per peer, what the per-group rate lets one machine send
  (on loopback there is no group). Counts what it sent and each answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm.tools.launcher)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

STEPS = ((0, 6), (6, 7), (7, 8), (8, 9))  # a prefill, then three decode steps
HUGE = {"float32": 3e38, "bfloat16": 3e38, "float16": 6e4}  # finite inputs whose outputs overflow
PROVEN_LOG = "proven to have signed a wrong output"


# --- the phases (in the benchmark's process) ---------------------------------------------------


@contextlib.contextmanager
def evidence_phase(bench, dht_node, attack: str, identities: int, finish_s: float):
    """Runs the attacker (`format` or `flood`) while the honest load runs; after the load,
    waits up to `finish_s` for it to say "done", stops it, then counts bans and holdings."""
    from hexswarm.swarm.tools.launcher import LaunchError
    from hexswarm.swarm.trust.bans import load_bans
    from hexswarm.swarm.trust.evidence_wire import read_holdings

    out = bench.workdir / f"actor-evidence-{attack}.json"
    args = [sys.executable, __file__, attack, "--initial-peers", *bench.initial_peers]
    args += ["--model", str(bench.model), "--targets", *bench.peers, "--out", str(out)]
    args += ["--identities", str(identities)]
    marks = {name: len(p.log()) for name, p in bench.peers.items()}
    proc = bench.local.start_command(f"actor-evidence-{attack}", args, ready="attacking", timeout=300)
    evidence: dict = {}
    try:
        yield evidence
        with contextlib.suppress(LaunchError):
            bench.local.wait_for_log(proc, "done", finish_s)
    finally:
        bench.local.stop(proc)
    try:
        evidence.update(json.loads(out.read_text()))
    except (OSError, ValueError):
        evidence["actor_failed"] = proc.log()[-1500:]
    time.sleep(3)  # holdings a peer announced reach the DHT
    with dht_node(bench, "reader") as (dht, _):
        honest = {r.peer_id: name for name, r in bench.honest_records(dht).items()}
        holdings = read_holdings(dht, bench.spec.model_id)
    honest.update({pid: name for name, pid in evidence.get("honest_signers", {}).items()})
    bans = load_bans(bench.workdir / "cache" / "bans.json")
    framed = {honest[p] for p in bans if p in honest} | {honest[h.liar] for h in holdings if h.liar in honest}
    logs = {name: p.log()[marks[name] :] for name, p in bench.peers.items()}
    evidence.update(
        honest_banned=len(framed),
        honest_banned_names=sorted(framed),
        bans_on_file=len(bans),
        holdings=len(holdings),
        holdings_against_honest=sum(h.liar in honest for h in holdings),
        proven_logged={n: text.count(PROVEN_LOG) for n, text in logs.items()},
        counts=_counts(attack, evidence, framed),
        count_goals={"honest_banned": 0} if attack == "format" else {},
        verdicts_logged=dict(
            Counter(re.findall(r"evidence from \S+ against \S+: (\w+)", "".join(logs.values())))
        ),
    )


def _counts(attack: str, evidence: dict, framed: set[str]) -> dict:
    """The phase's own counts: honest signers framed (the swarm's peers among them), or what
    the flood sent and how it was answered."""
    if attack == "format":
        stacks = set(evidence.get("honest_signers", {}))
        return {"honest_banned": len(framed), "honest_swarm_peers_banned": len(framed - stacks)}
    answers = evidence.get("answers", {})
    merged = sum((Counter(a) for a in answers.values()), Counter())
    return {
        "flood_requests": sum(v for k, v in evidence.get("sent", {}).items() if k.endswith("_started")),
        "flood_answered": sum(merged.values()),
        "flood_bodies_sent": sum(v for k, v in evidence.get("sent", {}).items() if k.endswith("_bodies")),
        "flood_sent_mib": evidence.get("sent_mib", {}).get("submit_bytes", 0),
        "flood_pulled_mib": evidence.get("sent_mib", {}).get("get_pulled_bytes", 0),
        "flood_answers": dict(merged.most_common()),
    }


# --- evidence an attacker can make of honest outputs ----------------------------------------


def tampered(e, other_peer_id: str, first_output: torch.Tensor) -> dict:
    """`e` as signed, and with each field its submitter can change altered (label -> evidence);
    `other_peer_id`: an honest peer neither the signer nor the judge."""
    from hexswarm.swarm.trust.verify_tolerance import TOLERANCES

    s = e.session
    out = {"as_signed": e}
    for fmt in TOLERANCES:
        if fmt != s.format:
            out[f"format={fmt}"] = dataclasses.replace(e, session=dataclasses.replace(s, format=fmt))
    out["owner"] = dataclasses.replace(e, session=dataclasses.replace(s, owner=other_peer_id))
    out["session_id"] = dataclasses.replace(e, session=dataclasses.replace(s, session_id="forged"))
    out["blocks"] = dataclasses.replace(e, session=dataclasses.replace(s, end=s.end + 1))
    out["output_dtype"] = dataclasses.replace(e, output=e.output.to(torch.bfloat16))
    out["records_cut"] = dataclasses.replace(e, records=e.records[:-1])
    out["peer_id"] = dataclasses.replace(e, peer_id=other_peer_id)
    first = e.records[0].position
    out["first_step"] = dataclasses.replace(e, step=0, inputs=e.inputs[:, :first], output=first_output)
    return out


async def signed_session(conn, spec, start: int, end: int, inputs: torch.Tensor):
    """A session of STEPS on `conn`'s peer over blocks [start, end), then its signed statement:
    (evidence of the last step, output of the first). Steps are sent raw, so that an output
    that overflowed (inf) is kept as the peer signed it."""
    from hexswarm.client.remote import random_session_id
    from hexswarm.swarm.trust.evidence import Evidence
    from hexswarm.swarm.wire.commitments import Signed, tensor_digest, verify_signature
    from hexswarm.swarm.wire.protocol import Attest, Attested, Step, StepResult

    session_id = random_session_id()
    await conn.open(session_id, spec.model_id, start, end, STEPS[-1][1], 1, torch.float32)
    log, outputs = conn.logs[session_id], []
    for first, last in STEPS:
        await conn.send(Step(session_id, first, inputs[:, first:last]))
        result = await conn.receive(StepResult)
        log.add(last - first, tensor_digest(inputs[:, first:last]), tensor_digest(result.hidden))
        outputs.append(result.hidden)
    attested = await conn.request(Attest(session_id), Attested)
    signed = Signed(attested.position, log.chain, attested.signature)
    if not verify_signature(conn.owner_marker, log.session, signed.position, signed.chain, signed.signature):
        raise RuntimeError(f"{conn.peer_name} signed other steps than it served")
    with contextlib.suppress(Exception):
        await conn.close_session(session_id)
    last = len(STEPS) - 1
    evidence = Evidence(
        log.session, conn.peer_id, conn.owner_marker, tuple(log.records), signed, last, inputs, outputs[-1]
    )
    return evidence, outputs[0]


def own_stack_evidence(spec, identity, owner: str, fmt: str, start: int, end: int, inputs: torch.Tensor):
    """What an honest peer computing in `fmt` signs for STEPS on blocks [start, end): a stack of
    our own, with a key of its own (float32 on the wire, as a client sends)."""
    from hexswarm.peer.blocks import BlockStack
    from hexswarm.swarm.trust.evidence import Evidence
    from hexswarm.swarm.wire.commitments import CommitmentLog, SessionId, Signed, statement, tensor_digest

    dtype = getattr(torch, fmt)
    stack = BlockStack.load(spec, start, end, dtype, torch.device("cpu"))
    cache = stack.new_cache("s")
    log = CommitmentLog(SessionId(spec.model_id, owner, f"{fmt}-stack", start, end, fmt))
    outputs = []
    for first, last in STEPS:
        output = stack(inputs[:, first:last].to(dtype), cache, first, start, end).to(torch.float32)
        log.add(last - first, tensor_digest(inputs[:, first:last]), tensor_digest(output))
        outputs.append(output)
    signature = identity.private_key.sign(statement(log.session, log.position, log.chain))
    signed = Signed(log.position, log.chain, signature)
    peer_id = identity.peer_id.to_base58()
    evidence = Evidence(
        log.session,
        peer_id,
        identity.owner_marker,
        tuple(log.records),
        signed,
        len(STEPS) - 1,
        inputs,
        outputs[-1],
    )
    return evidence, outputs[0]


def judges(targets) -> list[tuple]:
    """(signer, judge, start, end): each honest peer with the other that shares most of its
    blocks (ties: the one judging least so far)."""
    judging, pairs = Counter(), []
    for signer in targets:
        options = [
            (min(signer.end, t.end) - max(signer.start, t.start), -judging[t.name], t)
            for t in targets
            if t.peer_id != signer.peer_id
        ]
        shared, _, judge = max(options, key=lambda o: o[:2])
        if shared > 0:
            judging[judge.name] += 1
            pairs.append((signer, judge, max(signer.start, judge.start), min(signer.end, judge.end)))
    return pairs


# --- submitting ---------------------------------------------------------------------------------


class Submitter:
    """Submits evidence from many identities in turn, moving on when one is rate-limited."""

    def __init__(self, swarms, stop: threading.Event):
        self.swarms, self.stop = swarms, stop
        self.turn = Counter()  # target -> index of the identity it is sent from next
        self.answers: defaultdict[str, Counter] = defaultdict(Counter)  # label -> answer -> count

    async def submit(self, target, label: str, data: bytes) -> None:
        from hexswarm.swarm.trust.evidence_wire import EvidenceRefused, call

        for attempt in range(6 * len(self.swarms)):
            swarm = self.swarms[self.turn[target.peer_id] % len(self.swarms)]
            self.turn[target.peer_id] += 1
            try:
                reply = await call(swarm.dialer, target.peer_id, {"op": "submit", "evidence": data}, 180)
                answer = str(reply.get("verdict"))
            except EvidenceRefused as e:
                answer = code_name(e.code)
                if answer in ("RATE_LIMITED", "BUSY") and not self.stop.is_set():
                    if attempt % len(self.swarms) == len(self.swarms) - 1:
                        await asyncio.sleep(5)  # every identity refused: wait for the buckets to refill
                    continue
            except (TimeoutError, ConnectionError, OSError) as e:
                answer = type(e).__name__
            self.answers[label][answer] += 1
            return
        self.answers[label]["gave_up"] += 1


def code_name(code: int) -> str:
    from hexswarm.swarm.wire.checks import ErrorCode

    with contextlib.suppress(ValueError):
        return ErrorCode(code).name
    return f"code {code}"


async def format_attack(swarms, targets, spec, args, stop: threading.Event) -> dict:
    """Every variant of every honest statement to its judge (see the module's docstring)."""
    from hostile_actor import connect

    from hexswarm.swarm.net.identity import load_or_create_identity

    me = swarms[0].p2p.peer_id.to_base58()
    submitter, plans, signers = Submitter(swarms, stop), [], {}
    gen = torch.Generator().manual_seed(49)
    for signer, judge, start, end in judges(targets):
        third = next((t.peer_id for t in targets if t.peer_id not in (signer.peer_id, judge.peer_id)), me)
        conn = await connect(swarms[0], signer, timeout=60)
        try:
            for kind, scale in (("", 1.0), ("huge_inputs:", HUGE["float32"])):
                inputs = torch.randn(1, STEPS[-1][1], spec.hidden_size, generator=gen)
                inputs = inputs.sign() * scale if kind else inputs
                evidence, first = await signed_session(conn, spec, start, end, inputs)
                variants = tampered(evidence, third, first) if not kind else {"as_signed": evidence}
                plans += [(judge, kind + label, e) for label, e in variants.items()]
        finally:
            conn.close()
    for fmt in ("bfloat16", "float16"):  # honest peers of other formats, as their own stacks
        identity = load_or_create_identity(None)
        signers[f"{fmt}-stack"] = identity.peer_id.to_base58()
        for judge in targets:
            start, end = judge.start, min(judge.end, judge.start + 2)
            for kind, scale in (("", 1.0), ("huge_inputs:", HUGE[fmt])):
                inputs = torch.randn(1, STEPS[-1][1], spec.hidden_size, generator=gen)
                inputs = inputs.sign() * scale if kind else inputs
                evidence, _ = own_stack_evidence(spec, identity, me, fmt, start, end, inputs)
                relabelled = dataclasses.replace(
                    evidence, session=dataclasses.replace(evidence.session, format="float32")
                )
                plans += [(judge, f"{fmt}_stack:{kind}as_signed", evidence)]
                plans += [(judge, f"{fmt}_stack:{kind}format=float32", relabelled)]
    by_target = defaultdict(list)
    for judge, label, evidence in plans:
        by_target[judge.peer_id].append((judge, label, evidence.to_bytes()))
    print(
        "attacking", flush=True
    )  # what another machine prepares costs the peers nothing: measured from here

    async def send_all(items) -> None:
        for judge, label, data in items:
            if stop.is_set():
                return
            await submitter.submit(judge, label, data)

    await asyncio.gather(*(send_all(items) for items in by_target.values()))
    print("done", flush=True)
    while not stop.is_set():
        await asyncio.sleep(0.2)
    return {
        "identities": len(swarms),
        "submitted": sum(sum(c.values()) for c in submitter.answers.values()),
        "planned": len(plans),
        "answers": {label: dict(c) for label, c in sorted(submitter.answers.items())},
        "honest_signers": signers,
    }


def main() -> None:
    import hostile_actor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attack", choices=("format", "flood"))
    parser.add_argument("--initial-peers", nargs="+", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--targets", nargs="+", required=True, help="honest peers' names")
    parser.add_argument("--out", required=True)
    parser.add_argument("--identities", type=int, default=8)
    args = parser.parse_args()
    from hostile_evidence_flood import flood_attack

    hostile_actor.SWARM_ATTACKS.update(format=format_attack, flood=flood_attack)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    began = time.monotonic()
    evidence = hostile_actor.run_swarm_attack(args, stop)
    evidence["attack_s"] = round(time.monotonic() - began, 1)
    Path(args.out).write_text(json.dumps(evidence))


if __name__ == "__main__":
    main()
