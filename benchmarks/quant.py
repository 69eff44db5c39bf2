"""Quantized peers (`run-peer --quant int8|nf4`) on SmolLM2-135M-Instruct against float32.

Prints one JSON line per weight format (none, int8, nf4; nf4 only where bitsandbytes runs
here, else a line with "skipped" and the reason). Every figure has its float32 baseline
(`*_fp32`) from the same run:

- `perplexity`: the model quantized locally as a peer quantizes it (peer/quant.py
  `quantize_model`), over the whole text in strided windows (512 tokens, stride 256: every
  token after the first is scored once, with at least 256 tokens of context where it has them).
  The text is tests/data/two_cities_chapters.txt: Charles Dickens, "A Tale of Two Cities"
  (1859), Book the First, chapters I "The Period" and II "The Mail", public domain, written
  out from memory of the original (small slips in wording are possible; the figures only need
  a fixed text).
- `weight_bytes_per_block`: the real bytes of decoder layer 0 after quantization (norms stay
  float32), and `linear_bytes_ratio`: the decoder layers' linear weights (with their scales)
  over their float32 bytes.
- `ms_per_token`: greedy decode through a real chain of two peers (0:15 and 15:30 on
  127.0.0.1, both started with `--quant q`; one bootstrap, every format's pair up at once) and
  one client accepting only that format: 32 new tokens after a 16-token prompt, the time per
  token after the first, median over repeats that take the formats in turn, so that load from
  elsewhere on a shared machine falls on all of them alike. `ms_per_token_local` is the same
  decode on the local model in that format, for reference.
- `exact_vs_local_quantized`: the swarm's greedy tokens equal the local quantized model's.
- `rss_mb_peer`: the resident memory (VmRSS) of the 0:15 peer's process once it is online, and
  `rss_mb_peer_decoded` after the decode runs. A float32 peer's weights are its memory-mapped
  checkpoint files, resident only once a forward has touched them, so only the second compares
  like with like; `rss_file_mb_peer_decoded` is the file-backed part of it.
- `goals`: the issue's goals for that format and whether this run met them (reported, not
  asserted): int8 perplexity <= 1.02x float32's, linear bytes <= 0.3x, decode <= 1.15x;
  nf4 perplexity <= 1.08x, linear bytes <= 0.17x.

Run: python benchmarks/quant.py [--repeats 5] [--new-tokens 32] [--save]
(--save: also write the lines to benchmarks/results/quant.json)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_results import save

# Before torch loads: the local models, the client and the peers share this machine's cores
# (see swarm.tools.launcher.COLOCATED_ENV).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from torch import nn

from hexswarm.peer.quant import QuantError, check_backend, quantize_model, weight_bytes
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.tools.launcher import LocalSwarm

FORMATS = ("none", "int8", "nf4")
PEERS = {"left": "0:15", "right": "15:30"}
TEXT_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "two_cities_chapters.txt"
PROMPT_TOKENS = 16
# the goals, as ratios to float32 (figure -> most allowed)
GOALS = {
    "int8": {"perplexity": 1.02, "linear_bytes": 0.3, "ms_per_token": 1.15},
    "nf4": {"perplexity": 1.08, "linear_bytes": 0.17},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--window", type=int, default=512, help="perplexity window (tokens)")
    parser.add_argument("--stride", type=int, default=256, help="perplexity stride (tokens)")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/quant.json")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    ids = tokenizer(TEXT_PATH.read_text(), return_tensors="pt").input_ids  # (1, T)
    prompt = ids[:, :PROMPT_TOKENS]
    full = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch.float32).eval()

    skipped = {q: reason for q in FORMATS if (reason := backend_problem(q))}
    models = {
        q: full if q == "none" else quantize_model(copy.deepcopy(full), q).eval()
        for q in FORMATS
        if q not in skipped
    }
    local = {q: local_figures(model, full, ids, args) for q, model in models.items()}
    for q, (output, ms) in interleaved_decode(models, prompt, args).items():
        local[q].update(ms_per_token_local=ms, reference=output)
    del models
    swarm = swarm_figures(prompt, local, args)

    base = {**local["none"], **swarm["none"]}
    lines = []
    for quant in FORMATS:
        line = {"bench": "quant", "model": spec.model_id, "quant": quant}
        if quant in skipped:
            line["skipped"] = skipped[quant]
        else:
            line.update(format_line(quant, {**local[quant], **swarm[quant]}, base, ids.shape[1]))
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.save:
        save("quant", {"bench": "quant", "lines": lines})


def backend_problem(quant: str) -> str | None:
    """Why `quant` cannot run on this machine's CPU (float32 peers), or None."""
    try:
        check_backend(quant, torch.float32, torch.device("cpu"))
    except QuantError as e:
        return str(e)
    return None


def local_figures(model: nn.Module, full: nn.Module, ids: torch.Tensor, args) -> dict:
    return {
        "perplexity": strided_perplexity(model, ids, args.window, args.stride),
        "weight_bytes_per_block": weight_bytes(model.model.layers[0]),
        "linear_bytes_ratio": linear_bytes(model) / linear_bytes(full),
    }


@torch.inference_mode()
def strided_perplexity(model: nn.Module, ids: torch.Tensor, window: int, stride: int) -> float:
    """exp(mean NLL) of tokens 1..T-1 of `ids` (1, T), each scored once: window k covers
    [k * stride, k * stride + window) and scores the targets the windows before it did not."""
    total, count, scored_to = 0.0, 0, 1  # targets below `scored_to` are scored already
    length = ids.shape[1]
    for begin in range(0, length - 1, stride):
        end = min(begin + window, length)
        logits = model(ids[:, begin:end]).logits[0, :-1].float()  # (end - begin - 1, vocab)
        targets = ids[0, begin + 1 : end]  # position i predicts token begin + 1 + i
        new = slice(scored_to - (begin + 1), None)
        nll = torch.nn.functional.cross_entropy(logits[new], targets[new], reduction="sum")
        total, count, scored_to = total + nll.item(), count + targets[new].numel(), end
        if end == length:
            break
    return math.exp(total / count)


def linear_bytes(model: nn.Module) -> int:
    """Bytes of the decoder layers' linear layers (quantized or not), scales and biases included."""
    linear = [
        module
        for layer in model.model.layers
        for module in layer.modules()
        if module is not layer and not list(module.children()) and "Linear" in type(module).__name__
    ]
    return sum(weight_bytes(module) for module in linear)


def swarm_figures(prompt: torch.Tensor, local: dict, args) -> dict:
    """One bootstrap; per format a pair of `--quant` peers, started once the previous pair is
    online (so each loads on otherwise idle cores), and a client accepting only that format.
    The decodes are then interleaved across formats (see `interleaved_decode`)."""
    from hexswarm.client import DistributedModelForCausalLM

    figures, clients = {}, {}
    with tempfile.TemporaryDirectory(prefix="hexswarm-quant-") as tmp:
        with LocalSwarm(Path(tmp)) as swarm:
            swarm.start_bootstrap()
            lefts = {}
            for quant in local:
                began = time.monotonic()
                peers = [
                    swarm.start_peer(DEFAULT_MODEL, layers, f"{quant}-{name}", "--quant", quant, wait=False)
                    for name, layers in PEERS.items()
                ]
                for proc in peers:
                    swarm.wait_for_log(proc, "online:", 300)
                lefts[quant] = peers[0]
                figures[quant] = {
                    "peers_online_s": round(time.monotonic() - began, 2),
                    "rss_mb_peer": proc_status(peers[0].popen.pid)["VmRSS"],
                }
            try:
                for quant in local:
                    clients[quant] = DistributedModelForCausalLM.from_pretrained(
                        DEFAULT_MODEL, initial_peers=swarm.initial_peers, quant=(quant,)
                    )
                decoded = interleaved_decode(clients, prompt, args)
                for quant, (output, ms) in decoded.items():
                    after = proc_status(lefts[quant].popen.pid)
                    figures[quant].update(
                        ms_per_token=ms,
                        exact_vs_local_quantized=bool(torch.equal(output, local[quant]["reference"])),
                        rss_mb_peer_decoded=after["VmRSS"],
                        rss_file_mb_peer_decoded=after["RssFile"],
                        chain=clients[quant].last_route,
                    )
            finally:
                for client in clients.values():
                    client.shutdown()
    return figures


def proc_status(pid: int) -> dict[str, float]:
    """A process's resident memory in MB: VmRSS, and its file-backed part RssFile."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {name: int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "RssFile")}


def interleaved_decode(models: dict, prompt: torch.Tensor, args) -> dict[str, tuple[torch.Tensor, float]]:
    """Format -> (the greedy output, median ms per token after the first). Each repeat decodes
    once with every model in turn, so a burst of load from elsewhere on this shared machine falls
    on all formats alike rather than on whichever was measured then; one warm-up round first."""
    per_token: dict[str, list[float]] = {quant: [] for quant in models}
    outputs = {}
    for repeat in range(args.repeats + 1):
        for quant, model in models.items():
            outputs[quant], ms = decode_once(model, prompt, args.new_tokens)
            if repeat:
                per_token[quant].append(ms)
    return {quant: (outputs[quant], statistics.median(per_token[quant])) for quant in models}


def decode_once(model, input_ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float]:
    """(the greedy output, ms per token after the first): times a 1-token generate() and a
    `new_tokens` one and charges the difference to the later tokens."""
    began = time.perf_counter()
    model.generate(input_ids, max_new_tokens=1, do_sample=False)
    first = time.perf_counter() - began
    began = time.perf_counter()
    output = model.generate(input_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return output, 1000 * (time.perf_counter() - began - first) / (new_tokens - 1)


def format_line(quant: str, got: dict, base: dict, tokens: int) -> dict:
    """One format's JSON fields, each figure beside its float32 baseline, and the goals."""
    ratios = {
        "perplexity": got["perplexity"] / base["perplexity"],
        "linear_bytes": got["linear_bytes_ratio"],
        "ms_per_token": got["ms_per_token"] / base["ms_per_token"],
    }
    return {
        "perplexity": round(got["perplexity"], 4),
        "perplexity_fp32": round(base["perplexity"], 4),
        "weight_bytes_per_block": got["weight_bytes_per_block"],
        "weight_bytes_per_block_fp32": base["weight_bytes_per_block"],
        "linear_bytes_ratio": round(got["linear_bytes_ratio"], 4),
        "ms_per_token": round(got["ms_per_token"], 2),
        "ms_per_token_fp32": round(base["ms_per_token"], 2),
        "ms_per_token_local": round(got["ms_per_token_local"], 2),
        "ms_per_token_local_fp32": round(base["ms_per_token_local"], 2),
        "exact_vs_local_quantized": got["exact_vs_local_quantized"],
        "rss_mb_peer": round(got["rss_mb_peer"], 1),
        "rss_mb_peer_fp32": round(base["rss_mb_peer"], 1),
        "rss_mb_peer_decoded": round(got["rss_mb_peer_decoded"], 1),
        "rss_mb_peer_decoded_fp32": round(base["rss_mb_peer_decoded"], 1),
        "rss_file_mb_peer_decoded": round(got["rss_file_mb_peer_decoded"], 1),
        "rss_file_mb_peer_decoded_fp32": round(base["rss_file_mb_peer_decoded"], 1),
        "ratios": {name: round(value, 3) for name, value in ratios.items()},
        "goals": {name: ratios[name] <= most for name, most in GOALS.get(quant, {}).items()},
        "tokens": tokens,
        "peers_online_s": got["peers_online_s"],
        "chain": got["chain"],
        "torch_threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    main()
