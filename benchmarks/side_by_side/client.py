"""The timing client of benchmarks/petals_side_by_side.py; runs in either venv (transformers 4.34 or 5).

    python client.py --mode local|petals|hexswarm --model DIR [--initial-peers MADDR] [--clients 1 2 4 8]

Workload: a prompt of --prompt-len random token ids (seeded, ids >= 3 so none is a special
token), greedy decoding of exactly --new-tokens tokens (min = max, so EOS cannot stop a model
early), float32. A transformers streamer stamps each new token:

- ttft: from the generate() call to the first new token (for a swarm this includes finding a
  route, opening the sessions and the prefill);
- decode ms/token: the gaps between consecutive new tokens;
- aggregate tokens/s with N clients: every new token of the N clients over the time from the
  first one's start to the last one's end.

The largest number of clients is started once, as separate processes (each with its own
connection to the swarm), loads the model and warms up with one generate(); then for each N in
--clients the first N of them start together (at a shared wall-clock instant) and run --runs
generate() calls each (--runs-one for N = 1). Prints one JSON object on its last stdout line.

A level that does not finish within --level-timeout seconds (a Petals session has been seen to
hang on a step under load: its step waits on a server that never answers) ends the run with
exit status 3; --out then holds the levels that finished, so the caller can run the rest again.
"""

import argparse
import json
import multiprocessing as mp
import queue
import statistics
import sys
import time

LEVEL_TIMEOUT_S = 900.0  # a client process waits this long for its next command
HUNG = 3  # exit status: a level did not finish in time
START_DELAY_S = 0.5  # between telling the clients when to start and that instant


class TimingStreamer:
    """A transformers streamer: its first put() is the prompt, each later one a new token."""

    def __init__(self):
        self.times = []
        self._prompt_seen = False

    def put(self, value):
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self):
        pass


def load_model(args):
    import torch

    if args.mode == "local":
        import transformers
        from transformers import LlamaForCausalLM

        # transformers 5 renamed torch_dtype to dtype
        old = int(transformers.__version__.split(".")[0]) < 5
        model = LlamaForCausalLM.from_pretrained(
            args.model, **{"torch_dtype" if old else "dtype": torch.float32}
        )
    elif args.mode == "petals":
        from petals import AutoDistributedModelForCausalLM

        model = AutoDistributedModelForCausalLM.from_pretrained(
            args.model,
            initial_peers=args.initial_peers,
            dht_prefix=args.dht_prefix,
            torch_dtype=torch.float32,
        )
    else:
        from hexswarm.client import DistributedModelForCausalLM

        model = DistributedModelForCausalLM.from_pretrained(args.model, initial_peers=args.initial_peers)
    model.eval()
    return model


def prompt_ids(args, vocab_size: int):
    import torch

    generator = torch.Generator().manual_seed(args.seed)
    return torch.randint(3, vocab_size, (1, args.prompt_len), generator=generator)  # (1, prompt_len)


def one_generate(model, ids, new_tokens: int) -> dict:
    import torch

    streamer = TimingStreamer()
    with torch.inference_mode():
        began = time.time()
        t0 = time.perf_counter()
        out = model.generate(
            ids,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=streamer,
        )
        t1 = time.perf_counter()
    new = out[0, ids.shape[1] :].tolist()
    if len(new) != new_tokens or len(streamer.times) != new_tokens:
        raise RuntimeError(f"{len(new)} tokens and {len(streamer.times)} stamps, expected {new_tokens}")
    times = streamer.times
    return {
        "start": began,  # wall clock: comparable across the client processes
        "end": began + (t1 - t0),
        "ttft_s": times[0] - t0,
        "gaps_s": [b - a for a, b in zip(times, times[1:], strict=False)],
        "ids": new,
    }


def worker(args, index: int, commands, results) -> None:
    """One client process: load, warm up, then run what the parent says until told to stop."""
    try:
        began = time.perf_counter()
        model = load_model(args)
        ids = prompt_ids(args, model.config.vocab_size)
        one_generate(model, ids, args.new_tokens)  # warm-up
        results.put({"index": index, "ready": True, "load_s": time.perf_counter() - began})
        while (command := commands.get(timeout=LEVEL_TIMEOUT_S)) is not None:
            start_at, runs = command
            time.sleep(max(0.0, start_at - time.time()))
            done = [one_generate(model, ids, args.new_tokens) for _ in range(runs)]
            results.put({"index": index, "runs": done, "prompt": ids[0].tolist()})
        if hasattr(model, "shutdown"):  # hexswarm's client holds a DHT node
            model.shutdown()
    except BaseException as e:  # reported to the parent instead of leaving it waiting
        results.put({"index": index, "error": f"{type(e).__name__}: {e}"})
        raise


def summarize_level(clients: int, replies: list[dict], new_tokens: int) -> dict:
    """The figures of one level: every run of every client pooled."""
    runs = [run for reply in replies for run in reply["runs"]]
    gaps = sorted(gap for run in runs for gap in run["gaps_s"])
    first, last = min(r["start"] for r in runs), max(r["end"] for r in runs)
    outputs = {tuple(run["ids"]) for run in runs}
    return {
        "clients": clients,
        "runs": len(runs),
        "ttft_ms": round(1000 * statistics.median(r["ttft_s"] for r in runs), 2),
        "decode_ms": round(1000 * statistics.median(gaps), 2),
        "decode_ms_p90": round(1000 * gaps[int(0.9 * (len(gaps) - 1))], 2),
        "aggregate_tokens_per_s": round(new_tokens * len(runs) / (last - first), 2),
        "same_output": len(outputs) == 1,
        "ids": list(runs[0]["ids"]),
    }


class LevelTimeout(TimeoutError):
    pass


def collect(results, want: int, key: str, timeout: float) -> list[dict]:
    replies = []
    deadline = time.time() + timeout
    while len(replies) < want:
        try:
            reply = results.get(timeout=max(1.0, deadline - time.time()))
        except queue.Empty:
            raise LevelTimeout(f"{len(replies)} of {want} clients answered within {timeout:.0f} s") from None
        if "error" in reply:
            raise RuntimeError(f"client {reply['index']}: {reply['error']}")
        if key in reply:
            replies.append(reply)
    return replies


def measure(args) -> dict:
    context = mp.get_context("spawn")
    most = max(args.clients)
    commands = [context.Queue() for _ in range(most)]
    results = context.Queue()
    procs = [context.Process(target=worker, args=(args, i, commands[i], results)) for i in range(most)]
    for proc in procs:
        proc.start()
    try:
        loads = collect(results, most, "ready", LEVEL_TIMEOUT_S)
        out = {"mode": args.mode, "load_s": round(statistics.median(r["load_s"] for r in loads), 2)}
        out["levels"] = []
        for clients in sorted(args.clients):
            start_at = time.time() + START_DELAY_S
            runs = args.runs_one if clients == 1 else args.runs
            for command in commands[:clients]:
                command.put((start_at, runs))
            try:
                replies = collect(results, clients, "runs", args.level_timeout)
            except LevelTimeout as e:
                out["hung"] = {"clients": clients, "error": str(e)}
                return out
            out["levels"].append(summarize_level(clients, replies, args.new_tokens))
            out["prompt"] = replies[0]["prompt"]
        return out
    finally:
        for command in commands:
            command.put(None)
        stop(procs)


def stop(procs, grace_s: float = 20.0) -> None:
    """Waits `grace_s` in all for the clients to exit, then terminates (and kills) the rest: a
    hung client never exits, and a Petals client can take long to."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for signal_them in ("terminate", "kill"):
        alive = [proc for proc in procs if proc.is_alive()]
        for proc in alive:
            getattr(proc, signal_them)()
        for proc in alive:
            proc.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("local", "petals", "hexswarm"), required=True)
    parser.add_argument("--model", required=True, help="a checkpoint folder")
    parser.add_argument("--initial-peers", nargs="*", default=[])
    parser.add_argument("--dht-prefix", help="Petals' DHT prefix of the model")
    parser.add_argument("--clients", type=int, nargs="+", default=[1])
    parser.add_argument("--runs-one", type=int, default=5, help="generate() calls with one client")
    parser.add_argument("--runs", type=int, default=3, help="generate() calls per client with several")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level-timeout", type=float, default=300.0, help="seconds one level may take")
    parser.add_argument("--out", help="also write the JSON line here")
    args = parser.parse_args()
    result = measure(args)
    line = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)
    return HUNG if "hung" in result else 0


if __name__ == "__main__":
    sys.exit(main())
