"""The peer's compute path on a GPU, in-process and without hivemind: exactness and speed.

For each model shape and dtype (float32, bfloat16, float16) on one device:

- exactness: greedy generation through a chain of 2-3 in-process peers (BlockStack, PeerCore and
  StepScheduler per block range, as peer/runtime.py builds them; hidden states cross between
  ranges on the CPU in the wire dtype; embeddings, final norm and LM head run locally, as
  client/model.py runs them) against Hugging Face `generate()` of the same checkpoint on the same
  device and dtype, token for token; and the largest |logit difference| of the prefill;
- speed, one peer serving every block: prefill tokens/s per block and ms per decode step per
  block at batch 1, decode tokens/s per block with 8 sessions stepping together through the
  scheduler's batching, and the figures the peer itself would announce (peer/throughput.py).
  The batch-1 session and each batched session decode after the same context (the prefill's
  512 tokens), so the batched speed-up compares attention over the same number of keys.

Models are random LlamaConfig checkpoints written to a temporary folder at run time: one with
SmolLM2-135M's shapes, one with Llama-2-7B's layer shapes but 4 layers. Prints one JSON line.

    python benchmarks/gpu_check.py --device cuda [--out gpu.json] [--save]   # the full check (one GPU);
        # --save: also write benchmarks/results/gpu_check.json at the end
    python benchmarks/gpu_check.py --device cpu --quick             # small shapes, under a minute
    python benchmarks/gpu_check.py --models llama2_7b_4layers --dtypes bfloat16 --sdpa flash efficient math

--probe times peer/batch_forward.py's decode_batch directly instead, for each allowed set of
attention kernels and each mask form / key padding (see PROBE_KERNELS, PROBE_VARIANTS), against
every session stepped alone, plus a profile of one batched step:

    python benchmarks/gpu_check.py --probe --models llama2_7b_4layers --dtypes bfloat16
    python benchmarks/gpu_check.py --probe --probe-kernels default --probe-variants bool_exact shipped --probe-steps 70
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import transformers
from bench_results import save
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

# None of these imports hivemind, gguf or pymoo at import time (checked with an import blocker),
# so this runs on a machine that has only torch, transformers, safetensors, msgpack and numpy.
from hexswarm.peer import batch_forward
from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.scheduler import BatchPolicy, StepScheduler
from hexswarm.peer.throughput import measure
from hexswarm.swarm.models.model_spec import ModelSpec, load_model_spec
from hexswarm.swarm.wire.protocol import Close, Open, Step
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

# name -> LlamaConfig shape; `ranges`: the block ranges of the exactness chain.
SHAPES = {
    "smollm2_135m": dict(hidden=576, heads=9, kv_heads=3, mlp=1536, layers=30, vocab=49152,
                         ranges=((0, 10), (10, 20), (20, 30))),
    "llama2_7b_4layers": dict(hidden=4096, heads=32, kv_heads=32, mlp=11008, layers=4, vocab=32000,
                              ranges=((0, 2), (2, 4))),
}  # fmt: skip
QUICK_SHAPES = {  # the same code paths at sizes a laptop CPU runs in seconds
    "smollm2_135m": dict(hidden=96, heads=6, kv_heads=2, mlp=192, layers=6, vocab=512,
                         ranges=((0, 2), (2, 4), (4, 6))),
    "llama2_7b_4layers": dict(hidden=128, heads=4, kv_heads=4, mlp=256, layers=4, vocab=512,
                              ranges=((0, 2), (2, 4))),
}  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROMPT_TOKENS = 16  # of the exactness prompt
BATCH_SESSIONS = 8  # sessions decoding together in the batched measurement
STEP_TIMEOUT_S = 120.0
PREFILL_REPEATS = 3  # sessions timed at batch 1: medians of their prefills and decode steps
# --sdpa: which attention kernels torch may pick (e.g. to tell whether one of them is slow)
SDPA_BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
OPTIONAL_PACKAGES = {"hivemind", "gguf", "pymoo"}  # absent on the GPU machine


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_checkpoint(directory: Path, shape: dict, device: torch.device, seed: int = 0) -> ModelSpec:
    """A random Llama checkpoint of `shape` (initialized on `device`: fast for 7B-sized layers)."""
    config = LlamaConfig(
        hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], intermediate_size=shape["mlp"],
        num_hidden_layers=shape["layers"], vocab_size=shape["vocab"], max_position_embeddings=4096,
        # Wider than the usual 0.02 (as swarm/commands/tiny_model.py does): greedy output of a 0.02 model
        # repeats one token, which would make the token-for-token comparison prove little.
        initializer_range=0.1, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # generation never stops early
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to("cpu").save_pretrained(directory)
    del model
    return load_model_spec(directory)


class LocalParts:
    """The client's own part of the model: embeddings, final norm and LM head, loaded from the
    checkpoint in the compute dtype, as client/local_parts.py's `build_local_parts` does."""

    def __init__(self, reference: LlamaForCausalLM):
        # The same checkpoint tensors in the same dtype that the client would load; copied so
        # that nothing here shares a module with the reference model it is compared against.
        config = reference.config
        self.embed = reference.model.embed_tokens.weight.detach().clone()
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps).to(self.embed)
        self.norm.weight.data.copy_(reference.model.norm.weight)
        self.head = reference.lm_head.weight.detach().clone()

    @torch.inference_mode()
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(ids, self.embed)  # (batch, tokens, hidden)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(self.norm(hidden.to(self.embed.device)), self.head)


class Peer:
    """One in-process peer: a BlockStack under PeerCore, stepped through its StepScheduler."""

    def __init__(self, spec: ModelSpec, start: int, end: int, dtype: torch.dtype, device: torch.device):
        self.stack = BlockStack.load(spec, start, end, dtype, device)
        limits = PeerLimits(max_sessions=16, max_length=4096, max_batch=1, cache_tokens=16 * 4096)
        self.core = PeerCore(self.stack, spec.model_id, limits)
        self.scheduler = StepScheduler(self.core, BatchPolicy())
        self.wire = DTYPE_NAMES[dtype]  # hidden states travel in the compute dtype

    def open(self, session_id: str, max_length: int) -> None:
        s = self.stack
        self.core.open(Open(session_id, s.spec.model_id, s.start, s.end, max_length, 1, self.wire))

    def submit(self, session_id: str, position: int, hidden: torch.Tensor):
        """Queues a step (hidden on the CPU, as it arrives from the wire); returns its future."""
        session, tensor = self.core.begin_step(Step(session_id, position, hidden))
        return self.scheduler.submit(session, tensor).future

    def step(self, session_id: str, position: int, hidden: torch.Tensor) -> torch.Tensor:
        return self.submit(session_id, position, hidden).result(timeout=STEP_TIMEOUT_S).hidden

    def close(self, session_id: str) -> None:
        self.core.close(Close(session_id))

    def stop(self) -> None:
        self.scheduler.stop()


def chain_generate(peers: list[Peer], local: LocalParts, prompt: torch.Tensor, new_tokens: int):
    """Greedy generation as the client chains it: prefill, then one token per step.
    Returns (token ids, prefill logits of every position, each step's last logits)."""
    wire = DTYPES[peers[0].wire]
    for peer in peers:
        peer.open("exact", prompt.shape[1] + new_tokens)
    tokens, step_logits, prefill_logits, position, ids = [], [], None, 0, prompt
    for _ in range(new_tokens):
        hidden = local.embed_tokens(ids).to("cpu", wire)
        for peer in peers:
            hidden = peer.step("exact", position, hidden)
        logits = local.logits(hidden)
        prefill_logits = logits if prefill_logits is None else prefill_logits
        step_logits.append(logits[:, -1].float())
        position += ids.shape[1]
        ids = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens.append(int(ids[0, 0]))
    for peer in peers:
        peer.close("exact")
    return tokens, prefill_logits, step_logits


def first_mismatch(tokens: list[int], expected: list[int]) -> int | None:
    """The first index where the two differ (a length difference counts), or None."""
    differing = (i for i, (a, b) in enumerate(zip(tokens, expected, strict=False)) if a != b)
    first = next(differing, None)
    if first is None and len(tokens) != len(expected):
        return min(len(tokens), len(expected))
    return first


def check_exactness(spec: ModelSpec, shape: dict, dtype: torch.dtype, device, new_tokens: int) -> dict:
    reference = AutoModelForCausalLM.from_pretrained(spec.path, dtype=dtype).to(device).eval()
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, shape["vocab"], (1, PROMPT_TOKENS), generator=generator).to(device)
    with torch.inference_mode():
        ref_prefill = reference(prompt).logits
        out = reference.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False,
            pad_token_id=0, return_dict_in_generate=True, output_logits=True,
        )  # fmt: skip
    ref_tokens = out.sequences[0, PROMPT_TOKENS:].tolist()
    local = LocalParts(reference)
    peers = [Peer(spec, start, end, dtype, device) for start, end in shape["ranges"]]
    try:
        tokens, prefill, steps = chain_generate(peers, local, prompt, new_tokens)
    finally:
        for peer in peers:
            peer.stop()
    mismatch = first_mismatch(tokens, ref_tokens)
    agreed = len(tokens) if mismatch is None else mismatch  # logits compared while contexts agree
    pairs = zip(steps[:agreed], out.logits[:agreed], strict=True)
    step_diffs = [(s - r.float()).abs().max().item() for s, r in pairs]
    return {
        "ranges": [list(r) for r in shape["ranges"]],
        "new_tokens": new_tokens,
        "match": mismatch is None,
        "first_mismatch": mismatch,
        "prefill_max_abs_logit_diff": (prefill.float() - ref_prefill.float()).abs().max().item(),
        "step_max_abs_logit_diff": max(step_diffs, default=0.0),
        "distinct_tokens": len(set(ref_tokens)),
        "tokens": tokens[:8],
        "hf_tokens": ref_tokens[:8],
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_batch1(peer: Peer, hidden_size: int, prefill_tokens: int, decode_steps: int, tag: str) -> dict:
    """Median seconds of a prefill (over PREFILL_REPEATS sessions) and of a decode step of one
    session, each through the scheduler and back on the CPU (so the device has finished)."""
    wire = DTYPES[peer.wire]
    prefills, steps = [], []
    for repeat in range(PREFILL_REPEATS):
        session_id = f"{tag}-{repeat}"
        peer.open(session_id, prefill_tokens + decode_steps)
        prompt = torch.randn(1, prefill_tokens, hidden_size).to(wire)
        tokens = [torch.randn(1, 1, hidden_size).to(wire) for _ in range(decode_steps)]
        began = time.perf_counter()
        peer.step(session_id, 0, prompt)
        prefills.append(time.perf_counter() - began)
        for position, token in enumerate(tokens, start=prefill_tokens):
            began = time.perf_counter()
            peer.step(session_id, position, token)
            steps.append(time.perf_counter() - began)
        peer.close(session_id)
    return {"prefill_s": statistics.median(prefills), "decode_s": statistics.median(steps)}


def time_batched(peer: Peer, hidden_size: int, context: int, decode_steps: int) -> dict:
    """BATCH_SESSIONS sessions, each with `context` tokens cached, send a decode step, all
    waiting at once, decode_steps times."""
    wire = DTYPES[peer.wire]
    names = [f"batch-{i}" for i in range(BATCH_SESSIONS)]
    for name in names:
        peer.open(name, context + decode_steps + 1)
        peer.step(name, 0, torch.randn(1, context, hidden_size).to(wire))
    peer.scheduler.batch_sizes.clear()
    rounds = [[torch.randn(1, 1, hidden_size).to(wire) for _ in names] for _ in range(decode_steps)]
    began, position = time.perf_counter(), context
    for tokens in rounds:
        futures = [peer.submit(name, position, token) for name, token in zip(names, tokens, strict=True)]
        for future in futures:
            future.result(timeout=STEP_TIMEOUT_S)
        position += 1
    elapsed = time.perf_counter() - began
    for name in names:
        peer.close(name)
    return {"seconds": elapsed, "batch_sizes": dict(collections.Counter(peer.scheduler.batch_sizes))}


def measure_speed(
    spec: ModelSpec, dtype: torch.dtype, device, prefill_tokens: int, decode_steps: int
) -> dict:
    """One peer serving every block: batch-1 prefill and decode, batched decode, and what the
    peer's own start-up measurement (peer/throughput.py) would announce."""
    peer = Peer(spec, 0, spec.num_blocks, dtype, device)
    try:
        blocks, hidden = spec.num_blocks, spec.hidden_size
        time_batch1(peer, hidden, prefill_tokens, 4, "warm-up")  # allocations, kernel choice
        one = time_batch1(peer, hidden, prefill_tokens, decode_steps, "batch1")
        batched = time_batched(peer, hidden, prefill_tokens, decode_steps)  # batch 1's context
        announced = measure(peer.stack)
    finally:
        peer.stop()
    batch1_tokens_per_s = blocks / one["decode_s"]
    batched_tokens_per_s = BATCH_SESSIONS * decode_steps * blocks / batched["seconds"]
    return {
        "blocks": blocks,
        "prefill_tokens": prefill_tokens,
        "prefill_chunk_tokens": BatchPolicy().prefill_chunk_tokens,
        "prefill_tokens_per_s_per_block": round(prefill_tokens * blocks / one["prefill_s"], 1),
        "decode_ms_per_block": round(1000 * one["decode_s"] / blocks, 4),
        "decode_ms_per_step": round(1000 * one["decode_s"], 3),
        "batched_sessions": BATCH_SESSIONS,
        "batched_context_tokens": prefill_tokens,  # the same as batch 1's decode context
        "batched_decode_tokens_per_s_per_block": round(batched_tokens_per_s, 1),
        "batched_speedup_vs_batch1": round(batched_tokens_per_s / batch1_tokens_per_s, 2),
        "batched_batch_sizes": batched["batch_sizes"],
        "announced": {
            "tokens_per_s": round(announced.tokens_per_s, 1),
            "decode_ms_per_block": round(announced.decode_ms_per_block, 4),
            "decode_batch_size": announced.decode_batch_size,
            "decode_batch_tokens_per_s": round(announced.decode_batch_tokens_per_s, 1),
        },
    }


# --probe: decode_batch timed directly (no scheduler, no CPU round trip) for each allowed set
# of attention kernels and each way of padding the stacked keys, to find what makes batched
# half-precision decode slow. Sessions have different lengths, so the padding mask matters.
PROBE_CONTEXTS = tuple(32 + 5 * i for i in range(BATCH_SESSIONS))  # tokens cached per session
PROBE_WARMUP = 2  # untimed steps first (kernel choice, allocations)
PROBE_KERNELS = {  # name -> kernels torch may pick (None: its own choice)
    "default": None,
    "no_cudnn": ["flash", "efficient", "math"],
    "efficient": ["efficient"],
    "math": ["math"],
    "cudnn": ["cudnn"],
}
# name -> (mask kind, multiple the key slots are rounded up to); "shipped": what decode_batch
# does now; "bool_exact": what it did before the fix (a boolean mask, keys padded to the longest)
PROBE_VARIANTS = {
    "shipped": (None, None),
    "bool_exact": ("bool", 1),
    "float_exact": ("float", 1),
    "bool_pad128": ("bool", 128),
    "float_pad128": ("float", 128),
}
_SHIPPED_MASK = batch_forward.padding_mask


def _kernels(name: str):
    backends = PROBE_KERNELS[name]
    return contextlib.nullcontext() if backends is None else sdpa_kernel([SDPA_BACKENDS[b] for b in backends])


def _probe_mask(kind: str):
    """padding_mask as `kind` ("bool" or additive "float"), whatever the shipped one returns."""

    def make(rows, key_lengths, slots, dtype, device):
        mask = _SHIPPED_MASK(rows, key_lengths, slots, dtype, device)
        allowed = mask if mask.dtype == torch.bool else mask == 0  # before and after the fix
        if kind == "bool":
            return allowed
        blocked = torch.zeros(allowed.shape, dtype=dtype, device=device)
        return blocked.masked_fill_(~allowed, torch.finfo(dtype).min)

    return make


@contextlib.contextmanager
def _variant(name: str):
    """Swaps decode_batch's key-slot count and mask form for one probe variant."""
    kind, multiple = PROBE_VARIANTS[name]
    if kind is None:
        yield
        return
    saved = batch_forward.key_slots, batch_forward.padding_mask
    batch_forward.key_slots = lambda lengths, device: -(-max(lengths) // multiple) * multiple
    batch_forward.padding_mask = _probe_mask(kind)
    try:
        yield
    finally:
        batch_forward.key_slots, batch_forward.padding_mask = saved


def _probe_inputs(hidden_size: int, dtype, device, steps: int) -> dict:
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randn(1, n, hidden_size, generator=generator) for n in PROBE_CONTEXTS]
    tokens = [
        [torch.randn(1, 1, hidden_size, generator=generator) for _ in PROBE_CONTEXTS] for _ in range(steps)
    ]
    return {
        "prompts": [p.to(device, dtype) for p in prompts],
        "tokens": [[t.to(device, dtype) for t in row] for row in tokens],
    }


def _prefilled(stack: BlockStack, prompts) -> list:
    caches = [stack.new_cache(f"probe-{i}") for i in range(len(prompts))]
    for cache, prompt in zip(caches, prompts, strict=True):
        stack(prompt, cache, 0, stack.start, stack.end)
    return caches


def _timed(device, run) -> tuple[float, object]:
    _sync(device)
    began = time.perf_counter()
    out = run()
    _sync(device)
    return time.perf_counter() - began, out


def probe_alone(stack: BlockStack, inputs: dict, device) -> tuple[dict, list]:
    """Every session stepped alone (batch 1): median step time, and each step's outputs."""
    caches, times, outputs = _prefilled(stack, inputs["prompts"]), [], []
    for k, row in enumerate(inputs["tokens"]):
        step = []
        for i, (cache, token) in enumerate(zip(caches, row, strict=True)):
            run = functools.partial(stack, token, cache, PROBE_CONTEXTS[i] + k, stack.start, stack.end)
            seconds, out = _timed(device, run)
            times += [seconds] if k >= PROBE_WARMUP else []
            step.append(out)
        outputs.append(step)
    median = statistics.median(times)
    return {
        "ms_per_step": round(1000 * median, 3),
        "tokens_per_s_per_block": round(stack.end / median, 1),
    }, outputs


def probe_batched(stack: BlockStack, inputs: dict, expected: list, device) -> dict:
    """All sessions stepped together through decode_batch; compared with `expected` (alone)."""
    caches, times, worst = _prefilled(stack, inputs["prompts"]), [], 0.0
    scale = max(e.abs().max().item() for step in expected for e in step)
    for k, row in enumerate(inputs["tokens"]):
        positions = [n + k for n in PROBE_CONTEXTS]
        run = functools.partial(stack.forward_batch, row, caches, positions, stack.start, stack.end)
        seconds, outs = _timed(device, run)
        times += [seconds] if k >= PROBE_WARMUP else []
        worst = max(worst, max((o - e).abs().max().item() for o, e in zip(outs, expected[k], strict=True)))
    tokens = len(PROBE_CONTEXTS) * len(times) * stack.end
    return {
        "ms_per_step_median": round(1000 * statistics.median(times), 3),
        "ms_per_step_max": round(1000 * max(times), 3),
        "tokens_per_s_per_block": round(tokens / sum(times), 1),
        "max_abs_diff_vs_alone": worst,
        "max_abs_output": scale,  # what that difference is relative to
    }


def profile_batched_step(stack: BlockStack, inputs: dict, device, top: int = 12) -> list:
    """The ops that take the most host time in one batched step (torch's own choices)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    caches = _prefilled(stack, inputs["prompts"])
    step = functools.partial(
        stack.forward_batch, inputs["tokens"][0], caches, list(PROBE_CONTEXTS), 0, stack.end
    )
    _timed(device, step)
    with torch.profiler.profile(activities=activities) as profiler:
        _timed(device, functools.partial(stack.forward_batch, inputs["tokens"][1], caches,
                                         [n + 1 for n in PROBE_CONTEXTS], 0, stack.end))  # fmt: skip
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [
        [e.key[:80], e.count, round(e.self_cpu_time_total / 1000, 3),
         round(getattr(e, "self_device_time_total", 0) / 1000, 3)]
        for e in events
    ]  # fmt: skip


def probe_model(spec: ModelSpec, dtype, device, steps: int, kernels, variants) -> dict:
    stack = BlockStack.load(spec, 0, spec.num_blocks, dtype, device)
    inputs = _probe_inputs(spec.hidden_size, dtype, device, PROBE_WARMUP + steps)
    result = {"contexts": list(PROBE_CONTEXTS), "steps": steps, "alone": {}, "batched": {}}
    result["profile_default_shipped"] = profile_batched_step(stack, inputs, device)
    log(f"profile: {json.dumps(result['profile_default_shipped'])}")
    for kernel in kernels:
        try:
            with _kernels(kernel):
                result["alone"][kernel], expected = probe_alone(stack, inputs, device)
                for variant in variants:
                    with _variant(variant):
                        result["batched"][f"{kernel}/{variant}"] = probe_batched(
                            stack, inputs, expected, device
                        )
        except Exception as e:  # a kernel set that cannot run these shapes: recorded, not fatal
            result["alone"].setdefault(kernel, {"error": f"{type(e).__name__}: {e}"[:300]})
        log(f"{kernel}: alone {result['alone'][kernel]}; batched "
            + json.dumps({k: v for k, v in result["batched"].items() if k.startswith(kernel + "/")}))  # fmt: skip
    return result


def run_probe(args, result: dict, workdir: Path) -> None:
    device = torch.device(args.device)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    steps = args.probe_steps or (3 if args.quick else 12)
    for name in args.models:
        spec = make_checkpoint(workdir / name, shapes[name], device)
        for dtype_name in args.dtypes:
            run = functools.partial(
                probe_model, spec, DTYPES[dtype_name], device, steps, args.probe_kernels, args.probe_variants
            )
            guarded(
                result["models"].setdefault(name, {}), dtype_name, f"probe {name} {dtype_name}", device, run
            )
            if args.out:
                args.out.write_text(json.dumps(result) + "\n")


def environment(device: torch.device) -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        env.update(device_name=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def guarded(result: dict, key: str, section: str, device: torch.device, run) -> None:
    """Runs one section; a failure is recorded in the result instead of ending the whole check."""
    began = time.perf_counter()
    log(f"{section} ...")
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    try:
        result[key] = run()
    except Exception as e:
        result[key] = {"error": f"{type(e).__name__}: {e}"}
        traceback.print_exc(file=sys.stderr)
    result[key]["seconds"] = round(time.perf_counter() - began, 1)
    if device.type == "cuda":
        result[key]["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    log(f"{section}: {json.dumps(result[key])}")


def run_checks(args, result: dict, workdir: Path) -> None:
    device = torch.device(args.device)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    new_tokens = args.new_tokens or (8 if args.quick else 32)
    prefill_tokens, decode_steps = (32, 4) if args.quick else (512, 32)
    for name in args.models:
        shape = shapes[name]
        log(f"writing a random {name} checkpoint")
        spec = make_checkpoint(workdir / name, shape, device)
        model = result["models"][name] = {"shape": {k: v for k, v in shape.items() if k != "ranges"}}
        for dtype_name in args.dtypes:
            dtype, entry = DTYPES[dtype_name], model.setdefault(dtype_name, {})
            exactness = functools.partial(check_exactness, spec, shape, dtype, device, new_tokens)
            guarded(entry, "exactness", f"{name} {dtype_name} exactness", device, exactness)
            speed = functools.partial(measure_speed, spec, dtype, device, prefill_tokens, decode_steps)
            guarded(entry, "speed", f"{name} {dtype_name} speed", device, speed)
            if args.out:
                args.out.write_text(json.dumps(result) + "\n")  # a timeout still leaves what ran


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small shapes (a CPU smoke test)")
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--new-tokens", type=int, default=0, help="tokens generated (default 32, quick 8)")
    parser.add_argument("--out", type=Path, help="also write the JSON here, after every section")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/gpu_check.json")
    parser.add_argument(
        "--sdpa",
        nargs="+",
        choices=SDPA_BACKENDS,
        help="allow only these attention kernels (default: torch's choice)",
    )
    parser.add_argument("--probe", action="store_true", help="time decode_batch's variants instead")
    parser.add_argument("--probe-steps", type=int, default=0, help="timed steps (default 12, quick 3)")
    parser.add_argument(
        "--probe-kernels", nargs="+", default=list(PROBE_KERNELS), choices=list(PROBE_KERNELS)
    )
    parser.add_argument(
        "--probe-variants", nargs="+", default=list(PROBE_VARIANTS), choices=list(PROBE_VARIANTS)
    )
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # keep stderr to this check's own lines
    began = time.perf_counter()
    result = {
        "bench": "gpu_check",
        "quick": args.quick,
        **environment(torch.device(args.device)),
        "models": {},
    }
    result["sdpa"] = args.sdpa or "default"
    # sdpa_kernel sets process-wide flags, so the schedulers' compute threads obey them too
    kernels = (
        sdpa_kernel([SDPA_BACKENDS[name] for name in args.sdpa]) if args.sdpa else contextlib.nullcontext()
    )
    with tempfile.TemporaryDirectory(prefix="hexswarm-gpu-check-") as workdir, kernels:
        (run_probe if args.probe else run_checks)(args, result, Path(workdir))
    result["seconds"] = round(time.perf_counter() - began, 1)
    # the order torch tried attention kernels in (3 cudnn, 1 flash, 2 efficient, 0 math); read
    # after the run, as torch settles it on the first attention call
    result["sdpa_priority"] = [int(b) for b in torch._C._get_sdp_priority_order()]
    result["all_match"] = all(
        entry.get("exactness", {}).get("match", False)
        for model in result["models"].values()
        for key, entry in model.items()
        if key in DTYPES
    )
    # none should be: the peer's compute path needs neither the DHT nor GGUF nor the planner
    result["imported_optional_packages"] = sorted({m.split(".")[0] for m in sys.modules} & OPTIONAL_PACKAGES)
    if args.out:
        args.out.write_text(json.dumps(result) + "\n")
    if args.save:
        save("gpu_check", result)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
