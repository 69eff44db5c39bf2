"""Petals 2.2.0 and hexswarm side by side on one emulated WAN (issue 51's measure).

The topology of benchmarks/wan.py, with no NAT so that Petals can serve: four hosts in network
namespaces (a DHT bootstrap, two servers/peers with half of SmolLM2-135M-Instruct's blocks each,
a client), every TCP connection a host opens to another delayed by `--delays` ms each way
(swarm/nat/netlab.py `delay_host`; 0 is the LAN control). The model is the side-by-side's
safetensors conversion of hexswarm's GGUF (benchmarks/side_by_side/checkpoints.py), which both
read; the client is the side-by-side's timing client (side_by_side/client.py: a 16-token random
prompt, `--new-tokens` greedy tokens, fp32, a warm-up generation, then `--runs` timed ones). One
system at a time, each on fresh namespaces.

One JSON line per system and delay: `system`, `speculate` (false), `one_way_ms`, `workload`
(`random16`), `ms_per_token` (median gap between tokens), `ttft_s`, `crossings_per_token`
((ms/token at this delay − at 0) ÷ the one-way delay), `tokens_per_step` (1), `exact` (every run's
tokens equal to the other system's at the same delay and to its own LAN run). Then one summary
line with hexswarm ÷ Petals per delay. Needs root, iproute2, iptables and the Petals venv
(built on first use, ~2 min; see side_by_side/petals_env.py). Run:
    python benchmarks/wan_side_by_side.py [--delays 0 25 75] [--runs 3] [--new-tokens 32] [--save]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save  # noqa: E402
from petals_side_by_side import ATTEMPTS, CLIENT, HUNG, PETALS_SERVER, Services, log, wait_for  # noqa: E402
from side_by_side import checkpoints, petals_env  # noqa: E402

from hexswarm.swarm.nat import netlab  # noqa: E402

ANY = "/ip4/0.0.0.0/tcp/0"
BOOT_MADDR = re.compile(rf"/ip4/{re.escape(netlab.PUBLIC_HOST_IP)}/tcp/\d+/p2p/\w+")
HALVES = ("0:15", "15:30")
PREFIX = "wan-smollm2"  # Petals' DHT prefix of the model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 25.0, 75.0], help="one way, ms")
    parser.add_argument(
        "--systems", nargs="+", default=["petals", "hexswarm"], choices=("petals", "hexswarm")
    )
    parser.add_argument("--runs", type=int, default=3, help="timed generate() calls per system and delay")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--work", type=Path, default=Path("/tmp/hexswarm-petals"), help="venv, models, logs")
    parser.add_argument(
        "--save", action="store_true", help="also write benchmarks/results/wan_side_by_side.json"
    )
    args = parser.parse_args()
    why_not = netlab.available()
    if why_not:
        sys.exit(f"wan_side_by_side: {why_not}")
    petals_python = petals_env.find_or_build(args.work, log)
    folder = args.work / "models" / "smollm2"
    checkpoints.ensure("smollm2", folder)
    lines, lan = [], {}
    for one_way_ms in sorted(args.delays):
        for system in args.systems:
            log(f"{system} at {one_way_ms:g} ms one way")
            line = run_system(system, one_way_ms, folder, petals_python, args)
            if one_way_ms == 0:
                lan[system] = line
            base = lan.get(system)
            line["exact"] = bool(base) and line["ids"] == base["ids"] and line["same_output"]
            if one_way_ms and base:
                line["crossings_per_token"] = round(
                    (line["ms_per_token"] - base["ms_per_token"]) / one_way_ms, 2
                )
            lines.append(line)
    summary = compare(lines)
    for line in lines:
        line.pop("ids")
        print(json.dumps(line), flush=True)
    print(json.dumps(summary), flush=True)
    if args.save:
        save("wan_side_by_side", {"bench": "wan_side_by_side", "lines": lines, "summary": summary})


def run_system(system: str, one_way_ms: float, folder: Path, petals_python: Path, args) -> dict:
    runs = args.work / "runs" / f"wan-{system}-{one_way_ms:g}"
    runs.mkdir(parents=True, exist_ok=True)
    with netlab.NetLab(homes=0) as net, Services(runs) as services:
        hosts = {"bootstrap": (net.public_ns, netlab.PUBLIC_HOST_IP)}
        hosts.update({name: net.add_host(k) for k, name in enumerate(("left", "right", "client"), start=1)})
        if one_way_ms:
            for ns, ip in hosts.values():
                net.delay_host(ns, ip, one_way_ms)
        start = start_petals if system == "petals" else start_hexswarm
        maddr, python, env = start(services, net, hosts, folder, petals_python, runs)
        client_args = ["--mode", system, "--model", str(folder), "--initial-peers", maddr, "--clients", "1"]
        client_args += [
            "--runs-one",
            str(args.runs),
            "--new-tokens",
            str(args.new_tokens),
            "--level-timeout",
            "120",
        ]
        if system == "petals":
            client_args += ["--dht-prefix", PREFIX]
        for attempt in range(1, ATTEMPTS + 1):  # a Petals client may hang on a step (petals_side_by_side.py)
            out = runs / f"client-{attempt}.json"
            result = run_client(services, net, hosts["client"][0], python, env, out, client_args)
            if result["levels"]:
                break
            log(f"{system}: the client hung ({result['hung']['error']}); a fresh one tries again")
    if not result["levels"]:
        raise RuntimeError(f"{system}: every client hung; see {runs}")
    level = result["levels"][0]
    return {
        "bench": "wan_side_by_side",
        "system": system,
        "speculate": False,
        "one_way_ms": one_way_ms,
        "workload": "random16",
        "ms_per_token": level["decode_ms"],
        "ttft_s": round(level["ttft_ms"] / 1000, 3),
        "crossings_per_token": None,
        "tokens_per_step": 1.0,
        "client_attempts": attempt,
        "same_output": level["same_output"],
        "ids": level["ids"],
    }


def start_petals(services: Services, net, hosts: dict, folder: Path, python: Path, runs: Path):
    env = petals_env.run_env(python.parent.parent)
    dht_args = [str(python), "-m", "petals.cli.run_dht", "--host_maddrs", ANY, "--no_relay"]
    dht_args += ["--identity_path", str(runs / "dht.key")]
    dht, dht_log = services.start("petals-dht", [*net.exec_prefix(hosts["bootstrap"][0]), *dht_args], env)
    maddr = wait_for(dht_log, BOOT_MADDR, dht)[0]
    servers = []
    for name, blocks in zip(("left", "right"), HALVES, strict=True):
        server = [str(python), str(PETALS_SERVER), str(folder), "--device", "cpu", "--torch_dtype", "float32"]
        server += ["--block_indices", blocks, "--initial_peers", maddr, "--host_maddrs", ANY]
        server += [
            "--dht_prefix",
            PREFIX,
            "--throughput",
            "1",
            "--skip_reachability_check",
            "--no_auto_relay",
        ]
        server += ["--cache_dir", str(runs / "cache")]
        servers.append(services.start(f"petals-{name}", [*net.exec_prefix(hosts[name][0]), *server], env))
    for proc, path in servers:
        wait_for(path, re.compile(r"\[INFO\] Started"), proc)
    return maddr, python, env


def start_hexswarm(services: Services, net, hosts: dict, folder: Path, petals_python: Path, runs: Path):
    env, bin_dir = dict(os.environ), Path(sys.executable).parent
    boot_args = [str(bin_dir / "hexswarm"), "bootstrap", "--host-maddrs", ANY]
    boot, boot_log = services.start(
        "hexswarm-bootstrap", [*net.exec_prefix(hosts["bootstrap"][0]), *boot_args], env
    )
    maddr = wait_for(boot_log, BOOT_MADDR, boot)[0]
    peers = []
    for name, blocks in zip(("left", "right"), HALVES, strict=True):
        peer = [str(bin_dir / "run-peer"), str(folder), "--layers", blocks, "--initial-peers", maddr]
        peer += ["--host-maddrs", ANY, "--device", "cpu", "--dtype", "float32", "--name", name]
        peers.append(services.start(f"hexswarm-{name}", [*net.exec_prefix(hosts[name][0]), *peer], env))
    for proc, path in peers:
        wait_for(path, re.compile(r"online: serving"), proc)
    return maddr, Path(sys.executable), env


def run_client(services: Services, net, ns: str, python: Path, env: dict, out: Path, args: list[str]) -> dict:
    """side_by_side/client.py inside the client's namespace, until it exits."""
    proc, path = services.start(
        "client", [*net.exec_prefix(ns), str(python), str(CLIENT), *args, "--out", str(out)], env
    )
    deadline = time.monotonic() + 1800
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the client did not finish in 1800 s; see {path}")
        time.sleep(1)
    if proc.returncode not in (0, HUNG) or not out.is_file():
        raise RuntimeError(f"the client exited with {proc.returncode}; see {path}")
    return json.loads(out.read_text())


def compare(lines: list[dict]) -> dict:
    """hexswarm ÷ Petals of ms/token and TTFT at each delay (below 1: hexswarm is faster)."""
    by = {(line["system"], line["one_way_ms"]): line for line in lines}
    ratios = {}
    for (system, delay), line in sorted(by.items()):
        other = by.get(("petals", delay))
        if system == "hexswarm" and other:
            ratios[f"{delay:g}"] = {
                "ms_per_token": round(line["ms_per_token"] / other["ms_per_token"], 3),
                "ttft": round(line["ttft_s"] / other["ttft_s"], 3),
                "same_tokens": line["ids"] == other["ids"],
            }
    return {"bench": "wan_side_by_side", "hexswarm_over_petals": ratios}


if __name__ == "__main__":
    main()
