"""hexswarm on an emulated WAN: what a token costs when every link between hosts has a delay.

Four hosts in network namespaces with no NAT (swarm/nat/netlab.py `add_host`): the bootstrap,
peer `left` (SmolLM2-135M-Instruct blocks 0:15), peer `right` (15:30) and the client. With
`--delays`, every TCP connection a host opens to another goes through a delay proxy in that
host's namespace (`delay_host`), so every round trip between two hosts is twice the one-way
delay; 0 is the LAN control on the same namespaces. For each delay a fresh swarm serves each
workload, greedy, `--repeats` times:

- `chat`: short questions through the chat template; `rewrite`: a ~300-token passage of
  Dickens to be repeated with one change, the answer started with its first clause changed
  (the case where drafting from the context pays); `summarize`: the passage to be summarised,
  quoting it.

One JSON line per delay and workload: `system`, `speculate`, `one_way_ms`, `rtt_ms_measured`
(median PING round trip from the client to `left` over its session stream), `workload`,
`ms_per_token` (median after the first), `ttft_s` (median time to the first token, the
session's opening included), `crossings_per_token` ((ms/token at this delay − at 0) ÷ the
one-way delay: how many one-way trips a token pays), `tokens_per_step` (new tokens per pass
through the chain: 1 without speculation), `exact` (every output equal to local transformers'
greedy output). With `--speculate both` (the default) each workload runs without and with
speculative steps (`prompt_lookup_num_tokens`, paced by client/drafting.py), alternated on the
same swarm so that both see the same machine.

Needs root, iproute2 and iptables. Run:
    python benchmarks/wan.py [--delays 0 25 75] [--repeats 3] [--new-tokens 32] [--speculate both] [--save]
(--save: also write the lines to benchmarks/results/wan.json). Petals' side of issue 51's
comparison is not run here yet.
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
from public_swarm import ping_ms, wait_for_pair  # noqa: E402
from real_model import TEXT  # noqa: E402

from hexswarm.client.drafting import MAX_DRAFTS  # noqa: E402
from hexswarm.swarm.models import gguf_checkpoint  # noqa: E402
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL  # noqa: E402
from hexswarm.swarm.nat import netlab  # noqa: E402
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402

ANY = "/ip4/0.0.0.0/tcp/0"
QUESTIONS = ("What is the capital of France?", "Name three uses of copper.", "Why is the sky blue?")
REWRITE = "Repeat this passage exactly, but write 'finest' instead of 'best':\n\n"
SUMMARIZE = "Summarize this passage in two sentences, quoting its most famous line:\n\n"


def workloads(tokenizer) -> dict[str, list[torch.Tensor]]:
    def chat(text: str) -> torch.Tensor:
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]

    passage = tokenizer.decode(tokenizer(TEXT).input_ids[:300])
    # The answer starts as an editor would start it: SmolLM2-135M asked to repeat a passage
    # paraphrases it instead (1 draft kept in 58 passes), which is not the case this measures.
    started = tokenizer(passage.split(",")[0].replace("best", "finest"), return_tensors="pt").input_ids
    return {
        "chat": [chat(q) for q in QUESTIONS],
        "rewrite": [torch.cat([chat(REWRITE + passage), started], dim=1)],
        "summarize": [chat(SUMMARIZE + passage)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 25.0, 75.0], help="one way, ms")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--pings", type=int, default=50)
    parser.add_argument("--speculate", choices=("off", "on", "both"), default="both")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/wan.json")
    args = parser.parse_args()
    why_not = netlab.available()
    if why_not:
        sys.exit(f"wan: {why_not}")
    spec, prompts, expected = model_and_prompts(args.new_tokens)
    lines, lan = [], {}
    for one_way_ms in sorted(args.delays):
        for line in run_at(one_way_ms, spec, prompts, expected, args):
            key = (line["workload"], line["speculate"])
            if one_way_ms == 0:
                lan[key] = line["ms_per_token"]
            base = lan.get(key)
            crossings = (line["ms_per_token"] - base) / one_way_ms if one_way_ms and base else None
            line["crossings_per_token"] = None if crossings is None else round(crossings, 2)
            print(json.dumps(line), flush=True)
            lines.append(line)
    if args.save:
        save("wan", {"bench": "wan", "model": spec.model_id, "lines": lines})


def model_and_prompts(new_tokens: int, names: tuple[str, ...] | None = None):
    """SmolLM2's spec, the workloads' prompts (or those in `names`), and local transformers'
    greedy output for each: what every line's `exact` compares against."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)
    gguf_checkpoint.materialize_all(spec.path)  # every weight file, for the local baseline
    prompts = workloads(AutoTokenizer.from_pretrained(spec.path))
    prompts = {name: ids for name, ids in prompts.items() if names is None or name in names}
    local = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    expected = {
        name: [local.generate(ids, max_new_tokens=new_tokens, do_sample=False) for ids in ids_list]
        for name, ids_list in prompts.items()
    }
    return spec, prompts, expected


def run_at(one_way_ms: float, spec, prompts: dict, expected: dict, args) -> list[dict]:
    """Every workload through a fresh swarm on namespaces whose links add `one_way_ms`."""
    with tempfile.TemporaryDirectory(prefix="hexswarm-wan-") as tmp, netlab.NetLab(homes=0) as net:
        hosts = {"bootstrap": (net.public_ns, netlab.PUBLIC_HOST_IP)}
        hosts.update({name: net.add_host(k) for k, name in enumerate(("left", "right", "client"), start=1)})
        if one_way_ms:
            for ns, ip in hosts.values():
                net.delay_host(ns, ip, one_way_ms)
        with LocalSwarm(Path(tmp)) as swarm:
            start_swarm(swarm, net, hosts, spec, {"left": "0:15", "right": "15:30"})
            return measure(swarm, hosts["client"][0], spec, prompts, expected, one_way_ms, args)


def start_swarm(swarm: LocalSwarm, net, hosts: dict, spec, peers: dict[str, str], *flags: str) -> None:
    """A bootstrap on the public host and a peer of each name in `peers` (name -> its layers) on
    its host of `hosts` (name -> (namespace, address)), with `flags`; back once all are online."""
    swarm.start_bootstrap(
        120,
        launcher=net.exec_prefix(hosts["bootstrap"][0]),
        host_maddrs=ANY,
        address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/",
    )
    procs = [
        swarm.start_peer(spec.path, layers, name, "--host-maddrs", ANY, *flags, wait=False,
                         launcher=net.exec_prefix(hosts[name][0]))
        for name, layers in peers.items()
    ]  # fmt: skip
    for proc in procs:
        swarm.wait_for_log(proc, "online:", 300)


def measure(
    swarm: LocalSwarm, client_ns: str, spec, prompts, expected, one_way_ms: float, args
) -> list[dict]:
    from hexswarm.client import DistributedModelForCausalLM

    torch.zeros(1).share_memory_()  # torch's shm manager in this namespace (see netlab.inside)
    with netlab.inside(client_ns):
        model = DistributedModelForCausalLM.from_pretrained(spec.path, initial_peers=swarm.initial_peers)
    try:
        left = wait_for_pair(model, "left", "right", timeout=120)
        rtt = ping_ms(model, left, args.pings)
        modes = {"off": [False], "on": [True], "both": [False, True]}[args.speculate]
        runs = {(name, speculate): Run() for name in prompts for speculate in modes}
        for _ in range(args.repeats):
            for (name, speculate), run in runs.items():
                for ids, want in zip(prompts[name], expected[name], strict=True):
                    run.generate(model, ids, want, args.new_tokens, speculate)
        return [run.line(name, speculate, one_way_ms, rtt, model) for (name, speculate), run in runs.items()]
    finally:
        model.shutdown()


class Run:
    """One workload's generations, with or without speculative steps."""

    def __init__(self):
        self.per_token, self.first, self.exact, self.tokens, self.passes = [], [], True, 0, 0

    def generate(self, model, ids, want, new_tokens: int, speculate: bool) -> None:
        drafting = {"prompt_lookup_num_tokens": MAX_DRAFTS} if speculate else {}
        began = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - began
        passes = model.drafts.passes
        began = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, **drafting)
        new = out.shape[1] - ids.shape[1]
        self.first.append(ttft)
        if new > 1:
            self.per_token.append(1000 * (time.perf_counter() - began - ttft) / (new - 1))
        self.tokens += new
        self.passes += model.drafts.passes - passes + 1  # the prompt's pass is not timed
        self.exact &= bool(torch.equal(out, want))

    def line(self, name: str, speculate: bool, one_way_ms: float, rtt: float, model) -> dict:
        return {
            "bench": "wan",
            "system": "hexswarm",
            "speculate": speculate,
            "one_way_ms": one_way_ms,
            "rtt_ms_measured": round(rtt, 2),
            "workload": name,
            "ms_per_token": round(statistics.median(self.per_token), 2),
            "ttft_s": round(statistics.median(self.first), 3),
            "tokens_per_step": round(self.tokens / max(self.passes, 1), 2),
            "exact": self.exact,
            "chain": model.last_route,
        }


if __name__ == "__main__":
    main()
