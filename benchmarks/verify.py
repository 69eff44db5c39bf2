"""Verification against dishonest peers on SmolLM2-135M-Instruct (client/verify.py).

A real swarm on 127.0.0.1: a bootstrap and four honest float32 peers, h1 and h4 [0:15), h2
and h3 [15:30). Each attack adds one dishonest peer for [15:30) (the last one, a prefill peer for
[0:30)), then greedy generations of `--new-tokens` tokens run from the text's prompts with
`verify=--rate` until the liar is banned (or `--max-prompts` ran); the peer is stopped after.

One JSON line per attack:
- `detected`: the liar was banned by the client's own check (a witness and a third peer
  agree); for the poisoned cache, the decode peer refused it and the request was served
  colocated;
- `tokens_to_detect`: tokens of the generations the liar served in, until it was caught
  (median over `--repeats` runs of the attack);
- `false_positives`: honest peers banned; `exact_after_rollback`: every generation equals
  the local model's;
- `honest_steps_compared`: from the honest line (`attack` "none"), hop steps compared with
  no liar in the swarm and `false_positives` among them;
- `overhead_compute`: (time with verification - time without) / time without, for the same
  generations on the honest swarm (on this 2-core machine every peer and the client share
  the cores, so time is compute);
- `commit_bytes_per_token`: the commitments' bytes per decode token and hop: the 8-byte input
  digest of every step, plus one 256-byte RSA signature per 64 steps;
- `evidence_proven`: `hexswarm recheck` on the evidence file the client saved proved the lie
  by recomputing it here (null where there is no signed output to prove: the poisoned cache);
- `peers_holding_evidence`: peers that re-checked the evidence the client shared and announce
  they hold it (median); `banned_on_another_machine`: a client with another cache folder (no
  bans) re-checked the announced evidence with two witnesses and banned the liar.

Every run starts a liar of a fresh identity, so no earlier run's ban names it.

Run: python benchmarks/verify.py [--rate 0.05] [--new-tokens 32] [--honest-tokens 2500] [--save]
(--save: also write the lines to benchmarks/results/verify.json)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_results import save

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.wire.commitments import DIGEST_BYTES, SIGN_EVERY

TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "two_cities_chapters.txt"
FAST = ("--announce-period", "2")
COMMIT_BYTES = DIGEST_BYTES + 256 / SIGN_EVERY
ATTACKS = {  # name -> (layers, run-peer flags of the liar)
    "noise_1pct": ("15:30", ("--debug-corrupt-outputs", "noise")),
    "skip_layer": ("15:30", ("--debug-corrupt-outputs", "skip-layer")),
    "finetune": ("15:30", ("--debug-corrupt-outputs", "finetune")),
    "int8_as_float32": ("15:30", ("--quant", "int8", "--debug-record", 'quant="none"')),
    "one_step_in_20": ("15:30", ("--debug-corrupt-outputs", "sometimes")),
    "squatting": ("15:30", ("--debug-corrupt-outputs", "noise")),
    "lying_witness": ("15:30", ("--debug-corrupt-outputs", "noise")),
    "poisoned_prefill": ("0:30", ("--role", "prefill", "--debug-push", "poison-kv")),
}


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def prompts(tokenizer, count: int, length: int = 12) -> list[torch.Tensor]:
    ids = tokenizer(TEXT.read_text(), return_tensors="pt").input_ids[0]
    step = (len(ids) - length) // count
    return [ids[i * step : i * step + length].unsqueeze(0) for i in range(count)]


def reference_outputs(spec, prompt_list, new_tokens: int) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    local = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch.float32).eval()
    return [local.generate(p, max_new_tokens=new_tokens, do_sample=False) for p in prompt_list]


def client(swarm, rate: float):
    from hexswarm.client import DistributedModelForCausalLM

    return DistributedModelForCausalLM.from_pretrained(
        DEFAULT_MODEL,
        initial_peers=swarm.initial_peers,
        verify=rate,
        verify_min_compared=0,  # this measures catching; steps no witness could check are counted, not fatal
        quant=("none",),
    )


def run_prompts(model, prompt_list, expected, new_tokens: int, stop=None) -> dict:
    """Generates from each prompt (stopping early once `stop()`); the tokens of generations the
    liar served in (its name in the route, or caught in that one) and exactness."""
    tokens, exact = 0, True
    for prompt, want in zip(prompt_list, expected, strict=True):
        out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
        done = stop is not None and stop()
        if done or "liar" in (model.last_route or ""):
            tokens += new_tokens
        exact = exact and bool(torch.equal(out, want))
        if done:
            break
    return {"tokens": tokens, "exact": exact}


def honest_line(swarm, prompt_list, expected, args) -> dict:
    """False positives over the honest swarm at verify=1.0, and the overhead at the rate."""
    model = client(swarm, 1.0)
    try:
        compared = []
        while model.verify_stats.compared < args.honest_steps:
            run_prompts(model, prompt_list, expected, args.new_tokens)
            compared.append(model.verify_stats.compared)
        stats = model.verify_stats
    finally:
        model.shutdown()
    timings = {}
    for rate in (0.0, args.rate, 0.0, args.rate):  # interleaved: load falls on both alike
        model = client(swarm, rate)
        try:
            began = time.perf_counter()
            run_prompts(model, prompt_list[:4], expected[:4], args.new_tokens)
            timings.setdefault(rate, []).append(time.perf_counter() - began)
        finally:
            model.shutdown()
    base, checked = min(timings[0.0]), min(timings[args.rate])
    return {
        "attack": "none",
        "rate": args.rate,
        "honest_steps_compared": stats.compared,
        "false_positives": stats.liars,
        "uncompared": dict(stats.uncompared),
        "overhead_compute": round((checked - base) / base, 3),
        "seconds_without": round(base, 2),
        "seconds_with": round(checked, 2),
        "commit_bytes_per_token": COMMIT_BYTES,
    }


def attack_line(swarm, attack: str, prompt_list, expected, args, names: dict) -> dict:
    runs = [one_attack_run(swarm, attack, prompt_list, expected, args, i) for i in range(args.repeats)]
    detected = [r for r in runs if r["detected"]]
    signed = attack != "poisoned_prefill"
    return {
        "attack": attack,
        "rate": args.rate,
        "detected": len(detected) == len(runs),
        "runs_detected": f"{len(detected)}/{len(runs)}",
        "tokens_liar_served": [r["tokens"] for r in runs],  # per run (0: never routed through it)
        "tokens_to_detect": statistics.median(r["tokens"] for r in detected) if detected else None,
        "false_positives": sum(r["honest_banned"] for r in runs),
        "exact_after_rollback": all(r["exact"] for r in runs),
        "rollbacks": sum(r["rollbacks"] for r in runs),
        "commit_bytes_per_token": COMMIT_BYTES,
        "evidence_proven": all(r["proven"] for r in runs) if signed else None,
        "peers_holding_evidence": statistics.median(r["holders"] for r in runs) if signed else None,
        "banned_on_another_machine": all(r["elsewhere"] for r in runs) if signed else None,
    }


def one_attack_run(swarm, attack: str, prompt_list, expected, args, repeat: int) -> dict:
    """One liar of a fresh identity (none of this machine's bans names it) until it is caught."""
    layers, flags = ATTACKS[attack]
    liar = swarm.start_peer(DEFAULT_MODEL, layers, f"liar-{attack}-{repeat}", *FAST, *flags, timeout=300)
    try:
        time.sleep(4)  # its record reaches the DHT
        return caught_run(swarm, attack, prompt_list, expected, args)
    finally:
        swarm.stop(liar)


def caught_run(swarm, attack: str, prompt_list, expected, args) -> dict:
    from hexswarm.swarm.trust.records import read_peer_records

    model = client(swarm, 1.0 if attack == "lying_witness" else args.rate)
    handler = _Lines()
    logging.getLogger("hexswarm.client.session").addHandler(handler)
    logging.getLogger("hexswarm.client.session").setLevel(logging.INFO)
    squats = squat(swarm, model) if attack == "squatting" else []
    try:
        names = {r.peer_id: r.name for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
        liars = {p for p, n in names.items() if n.startswith("liar")}
        if not liars or liars & model.swarm.distrusted:
            raise RuntimeError(f"the liar is missing or banned before the run: {names}")
        if attack == "poisoned_prefill":

            def caught():
                return any("disaggregated prefill failed" in line for line in handler.lines)
        else:

            def caught():
                return bool(liars & model.swarm.distrusted)

        result = run_prompts(model, prompt_list, expected, args.new_tokens, stop=caught)
        banned_now = {p for p in model.swarm.distrusted if p in names}
        proven = caught() and attack != "poisoned_prefill" and evidence_proven(liars)
        holders, elsewhere = evidence_travel(swarm, model, liars) if proven else (0, False)
        return {
            "proven": proven,
            "holders": holders,
            "elsewhere": elsewhere,
            "detected": caught(),
            "tokens": result["tokens"],
            "exact": result["exact"],
            "honest_banned": len(banned_now - liars),
            "rollbacks": model.verify_stats.rollbacks,
        }
    finally:
        logging.getLogger("hexswarm.client.session").removeHandler(handler)
        for conn in squats:
            conn.close()
        model.shutdown()
        if squats:
            import hexswarm.client.hop_links as hop_links
            import hexswarm.client.remote as remote
            import hexswarm.client.verify as verify

            hop_links.random_session_id = verify.random_session_id = remote.random_session_id


def evidence_proven(liars: set[str]) -> bool:
    """`hexswarm recheck` proves the newest evidence file against one of `liars`."""
    import subprocess
    import sys

    from hexswarm.swarm.trust.evidence import Evidence, evidence_dir

    files = sorted(evidence_dir().glob("*.msgpack"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in files:
        if Evidence.from_bytes(path.read_bytes()).peer_id in liars:
            command = [sys.executable, "-m", "hexswarm", "recheck", DEFAULT_MODEL, str(path)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            return done.returncode == 0 and "PROVEN" in done.stdout
    return False


def evidence_travel(swarm, model, liars: set[str], timeout: float = 90.0) -> tuple[int, bool]:
    """(peers announcing they proved the liar wrong, whether a client with another cache folder,
    one of another machine, re-checks that and bans the liar)."""
    from hexswarm.swarm.trust.evidence_wire import read_holdings

    deadline, holders = time.monotonic() + timeout, set()
    while time.monotonic() < deadline and len(holders) < 2:
        holders = {h.holder for h in read_holdings(model.swarm.dht, model.spec.model_id) if h.liar in liars}
        time.sleep(1)
    own = os.environ["HEXSWARM_CACHE_DIR"]
    with tempfile.TemporaryDirectory(prefix="hexswarm-other-machine-") as other_cache:
        os.environ["HEXSWARM_CACHE_DIR"] = other_cache
        try:
            other = client(swarm, 0.05)
            try:
                verdicts = other.recheck_evidence()
            finally:
                other.shutdown()
        finally:
            os.environ["HEXSWARM_CACHE_DIR"] = own
    return len(holders), any(verdicts.get(liar) == "proven" for liar in liars)


def squat(swarm, model) -> list:
    """The old scheme's attack, with the ids known in advance: the client's session ids are made
    predictable for this run, and another identity opens each of them on every peer first.
    Sessions live in their opener's namespace, so none of them touches the client's."""
    import hexswarm.client.hop_links as hop_links
    import hexswarm.client.verify as verify
    from hexswarm.client.worker import run_sync
    from hexswarm.swarm.trust.records import read_peer_records

    known = [f"known-{i}" for i in range(8)]
    ids = iter(known + [f"later-{i}" for i in range(100_000)])
    hop_links.random_session_id = verify.random_session_id = lambda: next(ids)
    attacker = client(swarm, 0.0)
    conns = []

    async def go():
        for record in read_peer_records(attacker.swarm.dht, attacker.spec.model_id):
            conn = await attacker.swarm.open_connection(record.peer_id, record.name, timeout=10)
            for sid in known:
                await conn.open(
                    sid, attacker.spec.model_id, record.start, record.end, 64, 1, attacker.wire_dtype
                )
            conns.append(conn)

    try:
        run_sync(go(), timeout=60)
    finally:
        attacker.shutdown()
    return conns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-prompts", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--honest-steps", type=int, default=10_000)
    parser.add_argument("--attacks", nargs="*", default=list(ATTACKS))
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/verify.json")
    args = parser.parse_args()
    lines = []
    from transformers import AutoTokenizer

    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)
    prompt_list = prompts(AutoTokenizer.from_pretrained(spec.path), args.max_prompts)
    expected = reference_outputs(spec, prompt_list, args.new_tokens)
    with tempfile.TemporaryDirectory(prefix="hexswarm-verify-") as tmp:
        env = {"HEXSWARM_CACHE_DIR": str(Path(tmp) / "cache")}  # bans of this run stay in it
        os.environ.update(env)
        with LocalSwarm(Path(tmp) / "logs", env=env) as swarm:
            swarm.start_bootstrap()
            honest = [
                swarm.start_peer(DEFAULT_MODEL, layers, name, *FAST, wait=False, timeout=300)
                for name, layers in (("h1", "0:15"), ("h4", "0:15"), ("h2", "15:30"), ("h3", "15:30"))
            ]
            for proc in honest:
                swarm.wait_for_log(proc, "online:", 300)
            if args.honest_steps:
                lines.append({"bench": "verify", **honest_line(swarm, prompt_list, expected, args)})
                print(json.dumps(lines[-1]), flush=True)
            for attack in args.attacks:
                line = attack_line(swarm, attack, prompt_list, expected, args, {})
                lines.append({"bench": "verify", **line})
                print(json.dumps(lines[-1]), flush=True)
    if args.save:
        save("verify", {"bench": "verify", "lines": lines})


if __name__ == "__main__":
    main()
