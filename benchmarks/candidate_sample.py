"""How many peers a fresh client pings before it routes, as the swarm grows: every record against
the bounded sample per block (client/candidate_sample.py).

Synthetic records (no network): N peers of a 30-block model, each serving a random range of 4 to
8 blocks, nobody measured yet (a fresh client). One JSON line per N: `peers`, `pinged_all` (what a
client pinged before the sample: every record), `pinged_sample` (the sample's size, the first
round's dials; a second round only follows for a block whose sampled peers all stay silent),
`min_per_block` (the fewest sampled peers serving any block; 0 where the random swarm itself
leaves a block unserved), `blocks_kept` (every block keeps min(8, its peers)), and the ratio. This counts the
rule's dials; what they cost on a real swarm is benchmarks/scale.py's work.

    python benchmarks/candidate_sample.py [--peers 25 100 300 1000 3000] [--save]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save  # noqa: E402

from hexswarm.client.candidate_sample import CANDIDATES_PER_BLOCK, sample_per_block  # noqa: E402
from hexswarm.swarm.trust.records import PeerRecord, PeerState  # noqa: E402

NUM_BLOCKS = 30


def records(count: int, rng: random.Random) -> list[PeerRecord]:
    out = []
    for i in range(count):
        span = rng.randint(4, 8)
        start = rng.randint(0, NUM_BLOCKS - span)
        out.append(
            PeerRecord(
                peer_id=f"Qm{i:05d}", name=f"p{i}", model_id="m", start=start, end=start + span,
                state=PeerState.ONLINE, throughput=100.0, decode_ms_per_block=1.0,
                cache_tokens_left=1000, open_sessions=0, max_length=2048,
                dtype="float32", device="cpu", version="0",
            )
        )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[25, 100, 300, 1000, 3000])
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    lines = []
    for count in args.peers:
        swarm = records(count, random.Random(count))
        sample = sample_per_block(swarm, CANDIDATES_PER_BLOCK, set(), b"candidate-sample")
        served = Counter(b for r in sample for b in range(r.start, r.end))
        available = Counter(b for r in swarm for b in range(r.start, r.end))
        line = {
            "bench": "candidate_sample",
            "peers": count,
            "per_block": CANDIDATES_PER_BLOCK,
            "pinged_all": count,
            "pinged_sample": len(sample),
            "min_per_block": min(served[b] for b in range(NUM_BLOCKS)),
            "blocks_kept": all(served[b] >= min(CANDIDATES_PER_BLOCK, n) for b, n in available.items()),
            "sample_over_all": round(len(sample) / count, 3),
        }
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.save:
        save("candidate_sample", {"bench": "candidate_sample", "lines": lines})


if __name__ == "__main__":
    main()
