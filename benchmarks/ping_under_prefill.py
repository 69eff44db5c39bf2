"""Does a peer keep answering while it computes? PING round trips during a long prefill.

One real peer serves blocks 0:N of SmolLM2-135M (the `smollm2-135m` built-in); a client opens a
session and sends one prefill of `--tokens` / 2 tokens, then `--decode-steps` decode steps (the
peer's only session), while a second stream of the same client PINGs the peer every
`--interval-ms`. The peer validates frames and answers pings on its event
loop and computes on its compute thread, so a ping should wait for nothing but the machine.

Prints one JSON line: the prefill's duration and the round trips measured while it ran
(p50 / p99 / max), the same during the decode steps (`decode_*`), against `idle_*`: the same
pings with nothing computing (the baseline).

Run: python benchmarks/ping_under_prefill.py [--tokens 2048] [--blocks 30] [--prefills 3] [--save]
(--save: also write the line to benchmarks/results/ping_under_prefill.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_results import save, stamp

from hexswarm.client.remote import PeerConnection
from hexswarm.client.swarm_client import SwarmClient
from hexswarm.client.worker import run_sync
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def ping_while(conn: PeerConnection, busy: asyncio.Future, interval_s: float) -> list[float]:
    rtts = []
    while not busy.done():
        rtts.append(await conn.ping())
        await asyncio.sleep(interval_s)
    return rtts


async def decode(conn: PeerConnection, session: str, position: int, steps: int) -> None:
    """One session's decode steps back to back: the peer's only work."""
    for i in range(steps):
        await conn.step(session, position + i, torch.randn(1, 1, 576))


async def measure(client: SwarmClient, peer_id: str, model_id: str, args) -> dict:
    from hivemind.p2p import PeerID

    pid = PeerID.from_base58(peer_id)
    idle_conn = await PeerConnection.connect(client.p2p, pid, "peer")
    idle = [await idle_conn.ping() for _ in range(50)]
    idle_conn.close()
    during, during_decode, prefill_s = [], [], []
    for i in range(args.prefills):
        work = await PeerConnection.connect(client.p2p, pid, "peer", timeout=600)
        pinger = await PeerConnection.connect(client.p2p, pid, "peer")
        session = f"prefill-{i}"
        await work.open(session, model_id, 0, args.blocks, args.tokens, 1, torch.float32)
        hidden = torch.randn(1, args.tokens // 2, 576)
        began = time.perf_counter()
        step = asyncio.ensure_future(work.step(session, 0, hidden))
        during += await ping_while(pinger, step, args.interval_ms / 1000)
        await step
        prefill_s.append(time.perf_counter() - began)
        decoding = asyncio.ensure_future(decode(work, session, args.tokens // 2, args.decode_steps))
        during_decode += await ping_while(pinger, decoding, args.interval_ms / 1000)
        await decoding
        work.close()
        pinger.close()
    return {
        "prefill_s": round(statistics.median(prefill_s), 3),
        "pings_during": len(during),
        "p50_ms": round(percentile(during, 0.5), 2),
        "p99_ms": round(percentile(during, 0.99), 2),
        "max_ms": round(max(during), 2),
        "decode_pings": len(during_decode),
        "decode_p50_ms": round(percentile(during_decode, 0.5), 2),
        "decode_p99_ms": round(percentile(during_decode, 0.99), 2),
        "decode_max_ms": round(max(during_decode), 2),
        "idle_p50_ms": round(percentile(idle, 0.5), 2),
        "idle_max_ms": round(max(idle), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--prefills", type=int, default=3)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument(
        "--save", action="store_true", help="also write benchmarks/results/ping_under_prefill.json"
    )
    args = parser.parse_args()
    started = stamp()
    model_id = load_model_spec("smollm2-135m").model_id
    with tempfile.TemporaryDirectory() as workdir, LocalSwarm(Path(workdir)) as local:
        local.start_bootstrap()
        local.start_peer(
            "smollm2-135m", f"0:{args.blocks}", "busy", "--max-length", str(args.tokens), timeout=300
        )
        client = SwarmClient.connect(local.initial_peers)
        try:
            peer_id = read_peer_records(client.dht, model_id)[0].peer_id
            figures = run_sync(measure(client, peer_id, model_id, args), timeout=1200)
        finally:
            client.shutdown()
    result = {"bench": "ping_under_prefill", "tokens": args.tokens, "blocks": args.blocks, **figures}
    print(json.dumps(result))
    if args.save:
        save(
            "ping_under_prefill", {**result, "prefills": args.prefills, "started": started, "ended": stamp()}
        )


if __name__ == "__main__":
    main()
