"""Calibrates verification's tolerance (swarm/trust/verify_tolerance.py) on SmolLM2-135M-Instruct.

For each weight format and compute dtype (float32, bfloat16, float16, int8 with bfloat16
matmuls), two honest computations of each span (blocks 0:15 and 15:30) are compared, token by
token, the way a witness checks a server:

- the *server* ran the prompt as one step, then each next token as its own decode step, in a
  batch with another session (peer/scheduler.py batches decode steps);
- the *witness* ran every token in one prefill-shaped pass on a fresh cache.

Both take the same inputs: the float32 model's hidden states of windows of a fixed text
(tests/data/two_cities_chapters.txt). The script prints one JSON line per format with the
honest per-token errors (p50, p99, max), mean square error and top-k agreement, and what the
same comparison gives for attacks on the server's side:

- `noise_1pct`: Gaussian noise at 1% of each token's RMS added to the output;
- `skip_layer`: the span's middle layer not run;
- `finetune`: one layer's weights perturbed by 1% of their RMS;
- `int8_as_float32`: (float32 line only) the output of int8 weights, checked as float32.

Each attack line says whether the calibrated tolerance flags it over a run of `--run` tokens.

Run: python benchmarks/verify_calibration.py [--windows 6] [--prompt 32] [--decode 96]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.debug import tamper
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.trust.verify_tolerance import TOLERANCES, compare, token_errors, topk_agreement

TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "two_cities_chapters.txt"
SPANS = ((0, 15), (15, 30))
FORMATS = {  # name -> (compute dtype, weight format)
    "float32": (torch.float32, "none"),
    "bfloat16": (torch.bfloat16, "none"),
    "float16": (torch.float16, "none"),
    "int8": (torch.bfloat16, "int8"),
}


def windows(spec, count: int, length: int) -> torch.Tensor:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(spec.path)(TEXT.read_text(), return_tensors="pt").input_ids[0]
    stride = (len(ids) - length) // max(count, 1)
    return torch.stack([ids[i * stride : i * stride + length] for i in range(count)])


def span_inputs(spec, ids: torch.Tensor) -> dict[tuple[int, int], torch.Tensor]:
    """The float32 model's input hidden states of each span, (windows, tokens, hidden)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    with torch.inference_mode():
        hidden = model(ids, output_hidden_states=True).hidden_states
    return {(start, end): hidden[start].clone() for start, end in SPANS}


def server_outputs(stack: BlockStack, inputs: torch.Tensor, prompt: int) -> torch.Tensor:
    """Prompt in one step, then one decode step per token batched with a second session."""
    dtype, outputs = stack.dtype, []
    other = torch.randn(1, 1, inputs.shape[-1], dtype=dtype)
    with torch.inference_mode():
        for window in inputs:
            cache, side = stack.new_cache("s"), stack.new_cache("side")
            x = window.unsqueeze(0).to(dtype)
            out = [stack(x[:, :prompt], cache, 0, stack.start, stack.end)]
            stack(other, side, 0, stack.start, stack.end)
            for t in range(prompt, x.shape[1]):
                step, _ = stack.forward_batch(
                    [x[:, t : t + 1], other], [cache, side], [t, t - prompt + 1], stack.start, stack.end
                )
                out.append(step)
            outputs.append(torch.cat(out, dim=1)[0])
    return torch.stack(outputs).float()


def witness_outputs(stack: BlockStack, inputs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.stack(
            [
                stack(w.unsqueeze(0).to(stack.dtype), stack.new_cache("w"), 0, stack.start, stack.end)[0]
                for w in inputs
            ]
        ).float()


def quantiles(values: torch.Tensor) -> dict:
    values = values.flatten().double()
    return {
        "p50": float(values.quantile(0.5)),
        "p99": float(values.quantile(0.99)),
        "max": float(values.max()),
    }


def runs_flagged(ours: torch.Tensor, theirs: torch.Tensor, tolerance, run: int, mses: list | None = None):
    """(runs flagged, runs) over consecutive runs of `run` tokens of each window; each run's mean
    square error goes to `mses`."""
    flagged = total = 0
    for w in range(ours.shape[0]):
        for first in range(0, ours.shape[1] - run + 1, run):
            total += 1
            result = compare(ours[w, first : first + run], theirs[w, first : first + run], tolerance)
            flagged += not result.agree
            if mses is not None:
                mses.append(result.mean_square_error)
    return flagged, total


def perturbed(stack: BlockStack, kind: str) -> BlockStack:
    """A copy of `stack` that lies as a --debug-corrupt-outputs peer does (peer/debug.py)."""
    bad = copy.deepcopy(stack)
    tamper(bad, kind.replace("_", "-"))
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--decode", type=int, default=96)
    parser.add_argument("--run", type=int, default=32, help="tokens a witness checks at once")
    parser.add_argument("--formats", nargs="*", default=list(FORMATS))
    args = parser.parse_args()
    torch.manual_seed(0)
    spec = load_model_spec(DEFAULT_MODEL)
    ids = windows(spec, args.windows, args.prompt + args.decode)
    inputs = span_inputs(spec, ids)
    int8_servers = {}
    for name in args.formats:
        dtype, quant = FORMATS[name]
        began, tolerance = time.perf_counter(), TOLERANCES[name]
        honest_errors, honest_topk, honest_mses, attacks = [], [], [], {}
        flagged = total = 0
        for start, end in SPANS:
            stack = BlockStack.load(spec, start, end, dtype, torch.device("cpu"), quant=quant)
            server, witness = (
                server_outputs(stack, inputs[start, end], args.prompt),
                witness_outputs(stack, inputs[start, end]),
            )
            if name == "int8":
                int8_servers[start, end] = server
            honest_errors.append(token_errors(server, witness))
            honest_topk.append(topk_agreement(server, witness))
            f, t = runs_flagged(server, witness, tolerance, args.run, honest_mses)
            flagged, total = flagged + f, total + t
            rms = server.pow(2).mean(dim=-1, keepdim=True).sqrt()
            cases = {"noise_1pct": server + 0.01 * rms * torch.randn_like(server)}
            for kind in ("skip_layer", "finetune"):
                cases[kind] = server_outputs(perturbed(stack, kind), inputs[start, end], args.prompt)
            for kind, bad in cases.items():
                a = attacks.setdefault(kind, {"runs_flagged": 0, "runs": 0, "errors": [], "mses": []})
                f, t = runs_flagged(bad, witness, tolerance, args.run, a["mses"])
                a["runs_flagged"] += f
                a["runs"] += t
                a["errors"].append(token_errors(bad, witness))
        line = {
            "bench": "verify_calibration",
            "format": name,
            "tokens_compared": int(sum(e.numel() for e in honest_errors)),
            "honest_token_error": quantiles(torch.cat([e.flatten() for e in honest_errors])),
            "honest_mean_square_error": float(torch.cat([e.flatten() for e in honest_errors]).pow(2).mean()),
            "honest_topk_agreement_min": float(torch.cat([e.flatten() for e in honest_topk]).min()),
            "honest_topk_agreement_mean": float(torch.cat([e.flatten() for e in honest_topk]).mean()),
            "honest_run_mse_max": max(honest_mses),
            "honest_runs_flagged": flagged,
            "runs": total,
            "tolerance": tolerance.__dict__,
            "attacks": {
                kind: {
                    "token_error_p50": float(torch.cat([e.flatten() for e in a["errors"]]).median()),
                    "run_mse_min": min(a["mses"]),
                    "runs_flagged": a["runs_flagged"],
                    "runs": a["runs"],
                }
                for kind, a in attacks.items()
            },
            "seconds": round(time.perf_counter() - began, 1),
        }
        print(json.dumps(line), flush=True)
    if int8_servers:
        flagged = total = 0
        errors = []
        for start, end in SPANS:
            stack = BlockStack.load(spec, start, end, torch.float32, torch.device("cpu"))
            witness = witness_outputs(stack, inputs[start, end])
            f, t = runs_flagged(int8_servers[start, end], witness, TOLERANCES["float32"], args.run)
            flagged, total = flagged + f, total + t
            errors.append(token_errors(int8_servers[start, end], witness))
        print(
            json.dumps(
                {
                    "bench": "verify_calibration",
                    "attack": "int8_as_float32",
                    "token_error_p50": float(torch.cat([e.flatten() for e in errors]).median()),
                    "runs_flagged": flagged,
                    "runs": total,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
