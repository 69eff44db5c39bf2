"""hexswarm against Petals 2.2.0 on this machine: the same checkpoints, layout and workload.

    python benchmarks/petals_side_by_side.py --save               # tiny and SmolLM2; ~35 min on 2 cores
    python benchmarks/petals_side_by_side.py --models tiny big smollm2 --clients 1 4

For each model (benchmarks/side_by_side/checkpoints.py: random Llama `tiny` 256 × 8 layers,
`big` 1024 × 16, and `smollm2`, SmolLM2-135M-Instruct converted from hexswarm's GGUF to a
safetensors folder Petals' transformers 4.34 reads), one system at a time, never both at once:

1. the local baseline: transformers' own generate() in each venv (transformers 4.34 for Petals,
   5 for hexswarm), whose outputs must agree: the converted checkpoint means the same thing to both;
2. Petals: `petals.cli.run_dht`, then two servers with half the blocks each (`--throughput 1`
   skips their speed test), ready when both log "Started"; then the clients;
3. hexswarm: `hexswarm bootstrap`, then two `run-peer --layers` with half the blocks each,
   ready when both log "online: serving" (as Petals' servers log "Started"; until 2026-11-28 it
   was when `hexswarm status --model` exits 0, which a loop of fresh `status` processes on the
   same 2 cores reaches 1-4 s later: that time is kept as `status_covered_s`); then the same
   clients.

The clients (side_by_side/client.py): 16-token prompt, 64 greedy tokens, fp32; ms/token, time
to first token and aggregate tokens/s for each number of concurrent client processes in
--clients. Every process of both systems runs with OMP_WAIT_POLICY=PASSIVE (hexswarm's set it
themselves; Petals' are given it, so neither spins on the cores the other processes need).
Petals runs in its own venv (side_by_side/petals_env.py: built on first use, or the workplace
harness's /tmp/petals-anchor/venv when present).

A Petals client has been seen to hang on a step under load (waiting for a server that never
answers); a level that takes over 300 s is then run again by fresh client processes, at most
3 times, and `hung_levels` lists each such hang, per system.

The last stdout line is one JSON object; per model and number of clients, hexswarm ÷ Petals
of decode ms/token and TTFT (below 1: hexswarm is faster) and of aggregate tokens/s (above 1:
hexswarm serves more). --save writes it to benchmarks/results/petals_side_by_side.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from side_by_side import checkpoints, petals_env

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "side_by_side" / "client.py"
PETALS_SERVER = HERE / "side_by_side" / "petals_server.py"
RESULT = HERE / "results" / "petals_side_by_side.json"
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
MADDR = re.compile(r"/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+")
READY_TIMEOUT_S = 300.0
HUNG = 3  # client.py's exit status when a level did not finish in time
ATTEMPTS = 3
CLIENT_TIMEOUT_S = 3600.0
COMMON_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}


def log(message: str) -> None:
    print(f"[side-by-side {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Services:
    """The processes of one swarm, each in its own session, stopped together (TERM, then KILL)."""

    def __init__(self, logs: Path):
        self.logs, self.procs = logs, []

    def start(self, name: str, args: list[str], env: dict) -> tuple[subprocess.Popen, Path]:
        path = self.logs / f"{name}.log"
        with open(path, "wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**env, **COMMON_ENV},
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc, path

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
        for proc in self.procs:  # children (p2pd daemons) that outlived their parent
            _signal_group(proc, signal.SIGKILL)
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group's id is the process's
    except ProcessLookupError:
        pass


def wait_for(path: Path, pattern: re.Pattern, proc: subprocess.Popen, count: int = 1) -> list[str]:
    """The first `count` matches of `pattern` in the log at `path`, once they are there."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        found = pattern.findall(path.read_text(errors="replace"))
        if len(found) >= count:
            return found[:count]
        if proc.poll() is not None:
            raise RuntimeError(f"{path.stem} exited ({proc.returncode}); see {path}")
        time.sleep(0.5)
    raise TimeoutError(f"{path.stem}: no {pattern.pattern!r} within {READY_TIMEOUT_S:.0f} s; see {path}")


def run_client(python: Path, env: dict, out: Path, args: list[str]) -> dict:
    """side_by_side/client.py in its own session (its clients' DHT daemons die with it)."""
    with Services(out.parent) as services:
        proc, log_path = services.start(out.stem, [str(python), str(CLIENT), "--out", str(out), *args], env)
        try:
            proc.wait(timeout=CLIENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{out.stem} ran over {CLIENT_TIMEOUT_S:.0f} s; see {log_path}") from None
        if proc.returncode not in (0, HUNG) or not out.is_file():
            raise RuntimeError(f"{out.stem} failed ({proc.returncode}); see {log_path}")
    return json.loads(out.read_text())


def run_levels(python: Path, env: dict, out: Path, args: list[str], clients: list[int]) -> dict:
    """client.py over every number of clients; after a hung level (client.py's docstring), a
    fresh client.py runs the levels left, at most ATTEMPTS times in all. The hangs are reported."""
    merged, hangs, left = {"levels": []}, [], sorted(clients)
    for attempt in range(ATTEMPTS):
        part_out = out.with_name(f"{out.stem}-{attempt}.json")
        part = run_client(python, env, part_out, [*args, "--clients", *map(str, left)])
        merged = {**part, "levels": merged["levels"] + part["levels"]}
        if "hung" not in part:
            break
        hangs.append(merged.pop("hung"))
        done = {level["clients"] for level in merged["levels"]}
        left = [n for n in left if n not in done]
        log(f"{out.stem}: {hangs[-1]}; running {left} clients again")
    merged["hangs"] = hangs
    return merged


def run_petals(
    python: Path, model: Path, layers: int, work: Path, client_args: list[str], clients: list[int]
) -> dict:
    env, prefix = petals_env.run_env(python.parent.parent), f"side-by-side-{model.name}"
    with Services(work) as services:
        began = time.monotonic()
        dht, dht_log = services.start(
            "petals-dht",
            [
                str(python),
                "-m",
                "petals.cli.run_dht",
                "--host_maddrs",
                LOOPBACK,
                "--no_relay",
                "--identity_path",
                str(work / "dht.key"),
            ],
            env,
        )
        maddr = wait_for(dht_log, MADDR, dht)[0]
        servers = []
        for index, blocks in enumerate(halves(layers)):
            servers.append(
                services.start(
                    f"petals-server{index}",
                    [
                        str(python),
                        str(PETALS_SERVER),
                        str(model),
                        "--device",
                        "cpu",
                        "--torch_dtype",
                        "float32",
                        "--block_indices",
                        blocks,
                        "--initial_peers",
                        maddr,
                        "--host_maddrs",
                        LOOPBACK,
                        "--dht_prefix",
                        prefix,
                        "--throughput",
                        "1",
                        "--skip_reachability_check",
                        "--no_auto_relay",
                        "--cache_dir",
                        str(work / "cache"),
                    ],
                    env,
                )
            )
        for proc, path in servers:
            wait_for(path, re.compile(r"\[INFO\] Started"), proc)
        start_s = time.monotonic() - began
        log(f"Petals swarm of {model.name} up in {start_s:.1f} s")
        args = ["--mode", "petals", "--initial-peers", maddr, "--dht-prefix", prefix, *client_args]
        result = run_levels(python, env, work / "petals-clients.json", args, clients)
    return {**result, "swarm_start_s": round(start_s, 2)}


def run_hexswarm(model: Path, layers: int, work: Path, client_args: list[str], clients: list[int]) -> dict:
    env, bin_dir = dict(os.environ), Path(sys.executable).parent
    with Services(work) as services:
        began = time.monotonic()
        boot, boot_log = services.start(
            "hexswarm-bootstrap", [str(bin_dir / "hexswarm"), "bootstrap", "--host-maddrs", LOOPBACK], env
        )
        maddr = wait_for(boot_log, MADDR, boot)[0]
        peers = [
            services.start(
                f"hexswarm-peer{index}",
                [
                    str(bin_dir / "run-peer"),
                    str(model),
                    "--layers",
                    blocks,
                    "--initial-peers",
                    maddr,
                    "--host-maddrs",
                    LOOPBACK,
                    "--device",
                    "cpu",
                    "--dtype",
                    "float32",
                ],
                env,
            )
            for index, blocks in enumerate(halves(layers))
        ]
        for proc, path in peers:  # as Petals' servers log "Started": announced and serving
            wait_for(path, re.compile(r"online: serving"), proc)
        start_s = time.monotonic() - began
        status = [str(bin_dir / "hexswarm"), "status", "--initial-peers", maddr, "--model", str(model)]
        while subprocess.run(status, capture_output=True, timeout=120, env={**env, **COMMON_ENV}).returncode:
            if (
                any(proc.poll() is not None for proc, _ in peers)
                or time.monotonic() - began > READY_TIMEOUT_S
            ):
                raise RuntimeError(f"the hexswarm swarm of {model.name} did not come up; see {work}")
            time.sleep(1)
        status_s = time.monotonic() - began
        log(
            f"hexswarm swarm of {model.name} up in {start_s:.1f} s (status saw it covered at {status_s:.1f} s)"
        )
        args = ["--mode", "hexswarm", "--initial-peers", maddr, *client_args]
        result = run_levels(Path(sys.executable), env, work / "hexswarm-clients.json", args, clients)
    return {**result, "swarm_start_s": round(start_s, 2), "status_covered_s": round(status_s, 2)}


def hivemind_sockets() -> set[Path]:
    return set(Path("/tmp").glob("hivemind-p2p*.sock"))


def bound_sockets() -> set[Path]:
    """Unix socket paths some live process is bound to (other jobs' swarms are left alone)."""
    with open("/proc/net/unix") as table:
        return {Path(fields[-1]) for fields in map(str.split, table) if fields[-1].startswith("/")}


def halves(layers: int) -> list[str]:
    """Two peers with half the blocks each, as `A:B` ranges."""
    return [f"0:{layers // 2}", f"{layers // 2}:{layers}"]


def compare(petals: dict, hexswarm: dict, local: dict) -> list[dict]:
    """hexswarm ÷ Petals for each number of clients both measured."""
    rows = []
    by_clients = {level["clients"]: level for level in petals["levels"]}
    for ours in hexswarm["levels"]:
        theirs = by_clients.get(ours["clients"])
        if theirs is None:
            continue
        rows.append(
            {
                "clients": ours["clients"],
                "decode_ms": [theirs["decode_ms"], ours["decode_ms"]],  # [Petals, hexswarm]
                "ttft_ms": [theirs["ttft_ms"], ours["ttft_ms"]],
                "aggregate_tokens_per_s": [theirs["aggregate_tokens_per_s"], ours["aggregate_tokens_per_s"]],
                "decode_ratio": round(ours["decode_ms"] / theirs["decode_ms"], 3),
                "ttft_ratio": round(ours["ttft_ms"] / theirs["ttft_ms"], 3),
                "aggregate_ratio": round(
                    ours["aggregate_tokens_per_s"] / theirs["aggregate_tokens_per_s"], 3
                ),
                "outputs_equal_local": [
                    theirs["same_output"] and theirs["ids"] == local["petals"]["levels"][0]["ids"],
                    ours["same_output"] and ours["ids"] == local["hexswarm"]["levels"][0]["ids"],
                ],
            }
        )
    return rows


def bench_model(name: str, petals_python: Path, work: Path, args) -> dict:
    folder = work / "models" / name
    record = checkpoints.ensure(name, folder)
    runs = work / "runs" / name
    runs.mkdir(parents=True, exist_ok=True)
    shared = ["--model", str(folder), "--runs", str(args.runs), "--runs-one", str(args.runs_one)]
    local_args = ["--mode", "local", *shared, "--clients", "1"]
    petals_venv_env = petals_env.run_env(petals_python.parent.parent)
    log(f"{name}: local baselines")
    local = {
        "petals": run_client(petals_python, petals_venv_env, runs / "local-petals-venv.json", local_args),
        "hexswarm": run_client(
            Path(sys.executable), dict(os.environ), runs / "local-hexswarm-venv.json", local_args
        ),
    }
    log(f"{name}: Petals")
    petals = run_petals(petals_python, folder, record["layers"], runs, shared, args.clients)
    log(f"{name}: hexswarm")
    hexswarm = run_hexswarm(folder, record["layers"], runs, shared, args.clients)
    local_ids = [local[system]["levels"][0]["ids"] for system in ("petals", "hexswarm")]
    rows = compare(petals, hexswarm, local)
    for run in (petals, hexswarm, *local.values()):  # the ids were compared above; keep the line short
        run.pop("prompt", None)
        for level in run["levels"]:
            level.pop("ids")
    return {
        **record,
        "local_outputs_agree": local_ids[0] == local_ids[1],  # transformers 4.34 and 5 on this folder
        "local_decode_ms": [local[s]["levels"][0]["decode_ms"] for s in ("petals", "hexswarm")],
        "local_ttft_ms": [local[s]["levels"][0]["ttft_ms"] for s in ("petals", "hexswarm")],
        "swarm_start_s": [petals["swarm_start_s"], hexswarm["swarm_start_s"]],
        "hung_levels": [petals["hangs"], hexswarm["hangs"]],  # [Petals, hexswarm]: levels run again
        "by_clients": rows,
        "raw": {"petals": petals, "hexswarm": hexswarm, "local": local},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=checkpoints.MODELS)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--runs-one", type=int, default=5, help="generate() calls with one client")
    parser.add_argument("--runs", type=int, default=3, help="generate() calls per client with several")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hexswarm-petals"), help="venv, models, logs")
    parser.add_argument("--save", action="store_true", help=f"also write the JSON line to {RESULT}")
    args = parser.parse_args()
    # a SIGTERM (a timeout, an impatient user) still stops both swarms' process groups
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began, sockets = time.monotonic(), hivemind_sockets()
    petals_python = petals_env.find_or_build(args.work, log)
    result = {"bench": "petals_side_by_side", "clients": args.clients, "models": {}}
    for name in args.models:
        result["models"][name] = bench_model(name, petals_python, args.work, args)
        log(f"{name}: {json.dumps(result['models'][name]['by_clients'])}")
    for left in hivemind_sockets() - sockets - bound_sockets():  # a killed p2pd leaves its socket file
        left.unlink(missing_ok=True)
    result["seconds"] = round(time.monotonic() - began, 1)
    line = json.dumps(result)
    if args.save:
        RESULT.parent.mkdir(exist_ok=True)
        RESULT.write_text(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
