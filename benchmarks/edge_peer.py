"""An edge peer (py-libp2p, no hivemind) in a chain, against a hivemind peer in its place.

SmolLM2-135M-Instruct, layers 0:15 on the peer under test and 15:30 on a hivemind peer, all on
this machine. The same run serves the chain twice: first with a hivemind `run-peer` on 0:15,
then, once it has left, with an `edge-peer` on 0:15. Prints one JSON line:

- `hop_ms_edge` / `hop_ms_hivemind`: median round trip of a PING frame from the client to the
  0:15 peer over its session stream (the transport alone: no layer runs).
- `ms_per_token_edge` / `ms_per_token_hivemind`: greedy decode after the first token, 16-token
  prompt, through the whole chain, with pushes between peers off (the client relays every hop,
  so the step crosses the peer under test's link twice); `*_push`: the same with pushes on (the
  default: the 0:15 peer pushes to the 15:30 peer).
- `exact`: both chains' greedy tokens equal local transformers'.

Run: python benchmarks/edge_peer.py [--pings 300] [--new-tokens 32] [--repeats 3] [--save]
(--save: also write the line to benchmarks/results/edge_peer.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm.tools.launcher)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_results import save  # noqa: E402
from real_model import TEXT, decode_ms  # noqa: E402

from hexswarm.swarm.models import gguf_checkpoint  # noqa: E402
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL  # noqa: E402
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402

SPLIT = "15"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/edge_peer.json")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)
    gguf_checkpoint.materialize_all(spec.path)  # a plain folder: the edge environment reads it as is
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids[:, :16]
    local = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    expected = local.generate(
        ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False
    )
    del local
    result = {"bench": "edge_peer", "model": spec.model_id, "torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="hexswarm-edge-") as tmp, LocalSwarm(Path(tmp)) as swarm:
        swarm.start_bootstrap()
        swarm.start_peer(spec.path, f"{SPLIT}:30", "right", timeout=300)
        left = swarm.start_peer(spec.path, f"0:{SPLIT}", "left", timeout=300)
        hivemind = measure(swarm, spec, ids, expected, "left", args)
        swarm.stop(left)
        swarm.start_edge_peer(spec.path, f"0:{SPLIT}", "edge", timeout=300)
        edge = measure(swarm, spec, ids, expected, "edge", args)
    for name, figures in (("hivemind", hivemind), ("edge", edge)):
        result[f"hop_ms_{name}"] = figures["hop_ms"]
        result[f"ms_per_token_{name}"] = figures["ms_per_token"]
        result[f"ms_per_token_{name}_push"] = figures["ms_per_token_push"]
        result[f"chain_{name}"] = figures["chain"]
    result["exact"] = all(figures[key] for figures in (hivemind, edge) for key in ("exact", "exact_push"))
    result["hop_ms_added"] = round(edge["hop_ms"] - hivemind["hop_ms"], 3)
    result["ratios"] = {
        "hop_ms": round(edge["hop_ms"] / hivemind["hop_ms"], 3),
        "ms_per_token": round(edge["ms_per_token"] / hivemind["ms_per_token"], 3),
        "ms_per_token_push": round(edge["ms_per_token_push"] / hivemind["ms_per_token_push"], 3),
    }
    if args.save:
        save("edge_peer", result)
    print(json.dumps(result), flush=True)


def measure(swarm: LocalSwarm, spec, ids, expected, name: str, args) -> dict:
    """A fresh client, once `name` serves 0:SPLIT: ping round trips to it, then the chain's
    decode with pushes off and on."""
    from hexswarm.client import DistributedModelForCausalLM

    model = DistributedModelForCausalLM.from_pretrained(spec.path, initial_peers=swarm.initial_peers)
    try:
        peer_id = wait_for_peer(model, name)
        figures = {"hop_ms": round(ping_ms(model, peer_id, args.pings), 3)}
        for push, suffix in ((False, ""), (True, "_push")):
            model.push = push
            out, ms = decode_ms(model, ids, args.new_tokens, args.repeats)
            if not model.last_route.startswith(f"{name}["):
                raise RuntimeError(f"the chain did not start at {name}: {model.last_route}")
            if push and model.last_hop_steps.get("push_failed"):
                raise RuntimeError(f"pushes failed: {model.last_hop_steps}")
            figures[f"ms_per_token{suffix}"] = round(ms, 2)
            figures[f"exact{suffix}"] = bool(torch.equal(out, expected))
        return {**figures, "chain": model.last_route}
    finally:
        model.shutdown()


def wait_for_peer(model, name: str, timeout: float = 60) -> str:
    from hexswarm.swarm.trust.records import read_peer_records

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_peer_records(model.swarm.dht, model.spec.model_id)
        if {r.name for r in records} == {name, "right"}:
            return next(r.peer_id for r in records if r.name == name)
        time.sleep(0.5)
    raise RuntimeError(f"the swarm did not come to {name} and right within {timeout} s")


def ping_ms(model, peer_id: str, count: int) -> float:
    """Median PING round trip over one session stream, after a few warm-up pings."""
    from hivemind.p2p import PeerID

    from hexswarm.client.remote import PeerConnection
    from hexswarm.client.worker import run_sync

    async def pings() -> list[float]:
        conn = await PeerConnection.connect(model.swarm.p2p, PeerID.from_base58(peer_id), "under-test")
        try:
            for _ in range(10):
                await conn.ping()
            return [await conn.ping() for _ in range(count)]
        finally:
            conn.close()

    return statistics.median(run_sync(pings(), timeout=120))


if __name__ == "__main__":
    main()
