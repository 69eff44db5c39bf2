"""Prefill-decode interference on a live peer: a decode step alone and during a prompt's prefill.

HexGen-2 §2 ("Batching"): batching a prefill with ongoing decode steps slows both, the more
the longer the prompt; that interference is what disaggregation removes. This measures it on a
real peer: one `run-peer` process serves all 30 blocks of SmolLM2-135M (the `smollm2-135m`
built-in) with its default batching (peer/scheduler.py: prompts run in chunks of at most
--prefill-chunk-tokens, sized to about --interleave-ratio x a decode batch's time while other
sessions decode, one chunk next to each decode batch). A client, over the swarm's own streams,
keeps one session decoding (`--rows` sequences, so a decode batch of that many rows) and, for
each N in --tokens, --repeats times:

1. alone: --steps decode steps with nothing else on the peer;
2. prefill alone: a second session's prompt of N tokens, with nothing decoding;
3. during: the same prompt while the first session decodes back to back; the decode steps
   that begin and end inside the prompt's prefill are the ones counted.

Prints one JSON line:
  decode_ms_alone          median decode step round trip over every "alone" run (ms)
  by_tokens[N]:
    decode_ms_during       median decode step while the prompt is prefilled (ms)
    ratio                  decode_ms_during / decode_ms_alone
    steps_during           decode steps that ran inside the prefill (median)
    prefill_ms_alone, prefill_ms_during   the prompt's round trip (median)
    excess_ms              prefill_ms_during - prefill_ms_alone - steps_during x decode_ms_alone:
                           what the peer spent over the prompt beyond doing the prompt and the
                           decode steps one after the other (the tokens/s interference costs)
    excess_ratio           excess_ms / prefill_ms_alone
  decode_s_ms_alone per repeat, the peer's flags and torch's threads, for the record.

`routing/scheduler/simulation/interference.py` fits its model to these figures.

Run: python benchmarks/interference.py [--tokens 128 512 1024] [--repeats 3] [--steps 16] [--rows 1] [--save]
(--save [NAME]: also write the line to benchmarks/results/interference.json, or NAME.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# Before torch loads: the client and the peer share this machine's cores (see swarm.tools.launcher).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from bench_results import save, stamp  # noqa: E402

from hexswarm.client.remote import PeerConnection  # noqa: E402
from hexswarm.client.swarm_client import SwarmClient  # noqa: E402
from hexswarm.client.worker import run_sync  # noqa: E402
from hexswarm.swarm.models.model_spec import load_model_spec  # noqa: E402
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402
from hexswarm.swarm.trust.records import read_peer_records  # noqa: E402

MODEL = "smollm2-135m"
BLOCKS = 30  # all of SmolLM2-135M's blocks: one peer does all the work
MAX_LENGTH = 4096  # run-peer --max-length: the decoding session's cache holds every step of the run
SESSION_TOKENS = 16384  # cache tokens one session may reserve on that peer (rows x length)


class Decoder:
    """One session decoding `rows` sequences one step at a time (random hidden states: the
    peer's cost does not depend on their values)."""

    def __init__(self, conn: PeerConnection, session: str, rows: int, hidden: int):
        self.conn, self.session, self.rows, self.hidden = conn, session, rows, hidden
        self.position = 0

    async def prime(self, tokens: int = 16) -> None:
        await self.conn.step(self.session, 0, torch.randn(self.rows, tokens, self.hidden))
        self.position = tokens

    async def step(self) -> tuple[float, float]:
        """(began, ended) perf_counter times of one decode step's round trip."""
        began = time.perf_counter()
        await self.conn.step(self.session, self.position, torch.randn(self.rows, 1, self.hidden))
        self.position += 1
        return began, time.perf_counter()


async def prefill(conn: PeerConnection, model_id: str, session: str, tokens: int, hidden: int) -> tuple:
    """(began, ended) of one prompt of `tokens` in a fresh session, closed after."""
    await conn.open(session, model_id, 0, BLOCKS, tokens + 1, 1, torch.float32)
    began = time.perf_counter()
    await conn.step(session, 0, torch.randn(1, tokens, hidden))
    ended = time.perf_counter()
    await conn.close_session(session)
    return began, ended


async def one_round(client, pid, model_id: str, decoder: Decoder, tokens: int, k: int, steps: int) -> dict:
    """The three measurements of one repeat for a prompt of `tokens` (module docstring)."""
    alone = [e - b for b, e in [await decoder.step() for _ in range(steps)]]
    conn = await PeerConnection.connect(client.p2p, pid, "peer", timeout=600)
    try:
        b, e = await prefill(conn, model_id, f"alone-{tokens}-{k}", tokens, decoder.hidden)
        prefill_alone = e - b
        task = asyncio.ensure_future(prefill(conn, model_id, f"during-{tokens}-{k}", tokens, decoder.hidden))
        spans = []
        while not task.done():
            spans.append(await decoder.step())
        p_began, p_ended = await task
    finally:
        conn.close()
    inside = [e - b for b, e in spans if b >= p_began and e <= p_ended]
    return {
        "alone": alone,
        "prefill_alone": prefill_alone,
        "prefill_during": p_ended - p_began,
        "inside": inside,
    }


async def measure(client: SwarmClient, peer_id: str, model_id: str, hidden: int, args) -> dict:
    from hivemind.p2p import PeerID

    pid = PeerID.from_base58(peer_id)
    conn = await PeerConnection.connect(client.p2p, pid, "peer", timeout=600)
    length = min(MAX_LENGTH, SESSION_TOKENS // args.rows)
    await conn.open("decoder", model_id, 0, BLOCKS, length, args.rows, torch.float32)
    decoder = Decoder(conn, "decoder", args.rows, hidden)
    await decoder.prime()
    for _ in range(args.steps):  # warm-up: the peer's running step times settle
        await decoder.step()
    rounds: dict[int, list[dict]] = {n: [] for n in args.tokens}
    for k in range(args.repeats):
        for n in args.tokens:
            rounds[n].append(await one_round(client, pid, model_id, decoder, n, k, args.steps))
    conn.close()
    return summarize(rounds)


def summarize(rounds: dict[int, list[dict]]) -> dict:
    """The printed figures (module docstring), in ms."""
    alone_ms = 1000 * statistics.median(t for rs in rounds.values() for r in rs for t in r["alone"])
    by_tokens = {}
    for n, rs in rounds.items():
        during_ms = (
            1000 * statistics.median(t for r in rs for t in r["inside"])
            if any(r["inside"] for r in rs)
            else None
        )
        steps = statistics.median(len(r["inside"]) for r in rs)
        p_alone = 1000 * statistics.median(r["prefill_alone"] for r in rs)
        p_during = 1000 * statistics.median(r["prefill_during"] for r in rs)
        excess = p_during - p_alone - steps * alone_ms
        by_tokens[n] = {
            "decode_ms_during": round(during_ms, 2) if during_ms else None,
            "ratio": round(during_ms / alone_ms, 3) if during_ms else None,
            "steps_during": steps,
            "prefill_ms_alone": round(p_alone, 1),
            "prefill_ms_during": round(p_during, 1),
            "excess_ms": round(excess, 1),
            "excess_ratio": round(excess / p_alone, 3),
        }
    return {"decode_ms_alone": round(alone_ms, 2), "by_tokens": by_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 1024], help="prompt lengths N")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each N")
    parser.add_argument("--steps", type=int, default=16, help="decode steps of each 'alone' run")
    parser.add_argument("--rows", type=int, default=1, help="sequences the decoding session carries")
    parser.add_argument("--peer-args", default="", help="extra run-peer flags, e.g. '--interleave-ratio 0'")
    parser.add_argument(
        "--save",
        nargs="?",
        const="interference",
        metavar="NAME",
        help="also write benchmarks/results/NAME.json",
    )
    args = parser.parse_args()
    started = stamp()
    spec = load_model_spec(MODEL)
    peer_flags = ["--max-length", str(MAX_LENGTH), *args.peer_args.split()]
    with tempfile.TemporaryDirectory() as workdir, LocalSwarm(Path(workdir)) as local:
        local.start_bootstrap()
        local.start_peer(MODEL, f"0:{BLOCKS}", "busy", *peer_flags, timeout=300)
        client = SwarmClient.connect(local.initial_peers)
        try:
            peer_id = read_peer_records(client.dht, spec.model_id)[0].peer_id
            figures = run_sync(measure(client, peer_id, spec.model_id, spec.hidden_size, args), timeout=1800)
        finally:
            client.shutdown()
    result = {
        "bench": "interference",
        "model": MODEL,
        "measured_on": "live peer (run-peer, all blocks), client over the swarm's streams",
        "rows": args.rows,
        "peer_flags": " ".join(peer_flags),
        "torch_threads": torch.get_num_threads(),
        **figures,
    }
    if args.save:
        save(args.save, {**result, "started": started, "ended": stamp()})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
