"""The control plane of N stand-in peers, measured as N grows (issue 50, its first part).

Each stand-in is a host of its own on an emulated internet (swarm/nat/netlab.py `add_host`: a
network namespace on one bridge, no NAT) running what a serving peer runs for the control
plane, with no model behind it: a real hivemind DHT node (`start_dht`, with its p2pd), a real
signed record of one model announced every `--period` seconds by the peer's own `Announcer`
(both keys, as `run-peer` stores them), and the peer's reads of the model's records through the
peer's own `RecordWindow` (swarm/trust/record_window.py: every one of the 32 shard keys at first,
swarm/trust/record_keys.py, then 2 a period, of about 8 records at most), once a period by default, as peer/runtime.py reads
them for every step of its period (`--reads-per-period` for more). Two real
`hexswarm bootstrap` processes on hosts of their own are the initial peers.

Measured per N, after a warm-up of one period, over `--seconds`:
- `record_bytes`: a stand-in's record as announced (its round trips to 32 others included);
- `largest_value_bytes`: the largest value a read of the model's key returned (its subkeys,
  each a signed record with its owner marker and signature);
- `upkeep_bytes_per_peer_s`: the bytes a stand-in's host sent and received a second (its
  namespace's interface counters: every byte its DHT node and p2pd moved), the mean over
  stand-ins; `node_bytes_s_p99` the 99th percentile over every host, the bootstraps included;
- `read_s_p50` / `read_s_p99` and `reads_failed`: the stand-ins' reads (a read over 10 s fails);
- `node_rpcs_s_mean` / `node_rpcs_s_p99`: the DHT calls (ping, store, find) a stand-in's node
  served a second, over stand-ins (the bootstraps are processes of their own, not counted);
- `status_s`: `hexswarm status --no-ping --json` from a host of its own (stand-ins answer no
  session pings, so pings are left out);
- with `--newcomer` (the default), then: a real `run-peer` of a tiny 4-block model joins from a
  home behind NAT (swarm/nat/netlab.py: MASQUERADE, inbound dropped) while the stand-ins run:
  `newcomer_online_s` (start to "online:"), `newcomer_reachability_s` (start to its relay slot
  confirmed, from its log), `newcomer_mode`, `dialback_busy` (BUSY answers its dial-backs got);
  and a fresh client in a second home: `first_token_s`, a whole `hexswarm generate
  --max-new-tokens 1` (process start, imports, DHT join, routing, the relay, one step);
- `exponent_upkeep`: over the runs, the slope of log(upkeep_bytes_per_peer_s) in log(N).

Not in it (issue 50 lists them): a third of the stand-ins behind NAT (the stand-ins share this
process's event loop, and a relay's sockets must be opened inside its host's namespace), the
coordinator and the plan watch of auto peers (benchmarks/swarm_idle.py --coordinator measures
`plan_followed_s` with real processes), a monitor, clients at a steady rate (a warm client's
routing decision is benchmarks/router.py's `cached_decision_ms`). Each DHT node costs ~90 MB
(its process and p2pd, measured), so 24 GB holds ~200 stand-ins. Each host has a /24 of its own (`add_host(own_subnet=True)`),
routed by the internet's namespace.

Needs root (namespaces). Run: python benchmarks/scale.py --peers 25 50 100 [--save]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save, stamp  # noqa: E402

MODEL_ID = "scale-llama-32b"  # the stand-ins' model: 32 blocks, 8 per stand-in
NUM_BLOCKS, BLOCKS_EACH = 32, 8
READ_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 120.0
NEWCOMER_TIMEOUT_S = 180.0
ANY = "/ip4/0.0.0.0/tcp/0"
# Round trips a stand-in's record carries: as many as a serving peer publishes once its probes
# have run 8 periods (peer/link_probe.py MAX_PUBLISHED), the largest part of its record.
LINKS_EACH = 32


@dataclass
class Reads:
    """What the stand-ins' reads of the model's key saw."""

    seconds: list[float] = field(default_factory=list)
    failed: int = 0
    largest_value_bytes: int = 0


def value_bytes(value) -> int:
    """The bytes of a read's value: each subkey (owner marker and signature) and its record."""
    if value is None or not isinstance(value.value, dict):
        return 0
    return sum(len(subkey) + len(entry.value) for subkey, entry in value.value.items())


def stand_in_record(i: int, peer_id: str, addrs: tuple[str, ...], others: list[str]):
    """Stand-in `i`'s record: 8 blocks of 32 (ranges spread evenly), speeds of a small GPU,
    and round trips to `others`, as a serving peer's record carries them."""
    from hexswarm.swarm import __version__
    from hexswarm.swarm.trust.records import PeerRecord, PeerState, link_tag

    start = (i * BLOCKS_EACH // 2) % (NUM_BLOCKS - BLOCKS_EACH + 1)
    return PeerRecord(
        peer_id=peer_id, name=f"stand-in-{i}", model_id=MODEL_ID, start=start, end=start + BLOCKS_EACH,
        state=PeerState.ONLINE, throughput=4000.0, decode_ms_per_block=1.5, cache_tokens_left=65536,
        open_sessions=0, max_length=2048, dtype="float16", device="cuda", version=__version__, addrs=addrs,
        links=tuple((link_tag(other), 20.0 + k) for k, other in enumerate(others)), decode_batch_size=8,
        decode_batch_tokens_per_s=12000.0,
    )  # fmt: skip


async def run_stand_in(
    dht, announcer, period: float, reads_per_period: int, stop: asyncio.Event, reads: Reads
) -> None:
    """Announces every `period` and reads the model's records `reads_per_period` times, as a
    peer does: through its RecordWindow (the whole swarm first, then a window of shards)."""
    from hexswarm.swarm.trust.record_window import RecordWindow
    from hexswarm.swarm.trust.records import PeerState, records_values

    async def read(shards: list[int]) -> dict:
        began = time.monotonic()
        values = await records_values(dht, MODEL_ID, READ_TIMEOUT_S, shards)
        if not values:  # an error, or no answer in time (logged); {key: None} is keys found empty
            reads.failed += 1
            return values
        reads.seconds.append(time.monotonic() - began)
        largest = max(value_bytes(value) for value in values.values())
        reads.largest_value_bytes = max(reads.largest_value_bytes, largest)
        return values

    window = RecordWindow(MODEL_ID, read)
    await asyncio.sleep(random.uniform(0, period))  # peers start at different times
    while not stop.is_set():
        await announcer.announce(PeerState.ONLINE)
        for _ in range(reads_per_period):
            await window.records()
        try:
            await asyncio.wait_for(stop.wait(), period)
        except TimeoutError:
            pass


RPC_COUNTS: dict[str, int] = {}  # in a stand-in's DHT process (forked from this one): the RPCs it served


def count_rpcs() -> None:
    """Every DHT node started after this, in a process forked from this one, counts the RPCs it
    serves (hivemind registers a node's `rpc_*` methods as its handlers when the node starts).
    Once per process: wrapped twice (a run of several N), each call counted twice."""
    from hivemind.dht.protocol import DHTProtocol

    if getattr(DHTProtocol.rpc_find, "counted", False):
        return

    def counting(name: str, served):
        async def handler(self, request, context):
            RPC_COUNTS[name] = RPC_COUNTS.get(name, 0) + 1
            return await served(self, request, context)

        handler.__annotations__, handler.__wrapped__ = served.__annotations__, served  # its types
        handler.counted = True
        return handler

    for name in ("rpc_ping", "rpc_store", "rpc_find"):
        setattr(DHTProtocol, name, counting(name, getattr(DHTProtocol, name)))


async def _served_rpcs(_dht, _node) -> int:
    """Runs in the DHT's process: the RPCs its node served so far."""
    return sum(RPC_COUNTS.values())


async def served_rpcs(dht) -> int:
    return await asyncio.wrap_future(dht.run_coroutine(_served_rpcs, return_future=True))


def host_bytes(ns: str) -> int:
    """Bytes the host in `ns` sent and received on its link to the internet so far."""
    done = subprocess.run(
        ["ip", "-n", ns, "-s", "-j", "link", "show", "wan0"], capture_output=True, text=True
    )
    stats = json.loads(done.stdout)[0]["stats64"]
    return stats["rx"]["bytes"] + stats["tx"]["bytes"]


def status_seconds(net, ns: str, initial_peers: list[str]) -> float | None:
    """How long `hexswarm status --no-ping --json` takes from the host in `ns`; None past
    STATUS_TIMEOUT_S (a line with a null, not a run that stops: 100 stand-ins starved it so)."""
    began = time.monotonic()
    try:
        subprocess.run(
            [*net.exec_prefix(ns), sys.executable, "-m", "hexswarm.swarm.commands.cli", "status", "--no-ping",
             "--json", "--initial-peers", *initial_peers],
            capture_output=True, timeout=STATUS_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - began


def newcomer_figures(net, swarm, model_dir: Path) -> dict:
    """A real `run-peer` of a tiny model joins the full swarm from a home behind NAT (home 1):
    how long until it is online, until its relay slot is confirmed, and the BUSY answers its
    dial-backs got; then a fresh client in home 2 (`hexswarm generate`, one new token: its
    process start, DHT join, routing, connections through the relay and one step) is timed."""
    began = time.monotonic()
    proc = swarm.start_peer(
        model_dir, "0:4", "newcomer", "--host-maddrs", ANY, wait=False, launcher=net.exec_prefix(net.home(1).host_ns)
    )  # fmt: skip
    try:
        swarm.wait_for_log(proc, "online:", NEWCOMER_TIMEOUT_S)
        online_s = time.monotonic() - began
    except Exception as e:  # noqa: BLE001 - a line with nulls, not a run that stops
        print(f"[scale] the newcomer did not come online: {e}", file=sys.stderr, flush=True)
        online_s = None
    log = proc.log()
    relayed = re.search(r"relay slot confirmed ([\d.]+) s after start", log)
    direct = re.search(r"reachable directly at .* \(([\d.]+) s after start\)", log)
    reach = relayed or direct
    client_began = time.monotonic()
    done = subprocess.run(
        [*net.exec_prefix(net.home(2).host_ns), sys.executable, "-m", "hexswarm.swarm.commands.cli", "generate",
         str(model_dir), "--prompt", "A swarm", "--max-new-tokens", "1", "--initial-peers", *swarm.initial_peers],
        capture_output=True, text=True, timeout=STATUS_TIMEOUT_S,
    )  # fmt: skip
    first_token_s = time.monotonic() - client_began if done.returncode == 0 and online_s else None
    if done.returncode != 0:
        print(f"[scale] the fresh client failed: {done.stderr.strip()[-300:]}", file=sys.stderr, flush=True)
    swarm.stop(proc, timeout=10)
    return {
        "newcomer_mode": "relayed" if relayed else ("direct" if direct else None),
        "newcomer_online_s": _rounded(online_s),
        "newcomer_reachability_s": _rounded(float(reach.group(1))) if reach else None,
        "dialback_busy": log.count("answered busy"),
        "first_token_s": _rounded(first_token_s),
    }


def measure(n: int, args) -> dict:
    """One swarm of `n` stand-ins: started, warmed up for a period, measured for args.seconds."""
    import torch

    from hexswarm.swarm.commands.tiny_model import make_tiny_model
    from hexswarm.swarm.nat import netlab
    from hexswarm.swarm.net.dht import start_dht
    from hexswarm.swarm.net.dht_process import shutdown_dht
    from hexswarm.swarm.net.identity import load_or_create_identity
    from hexswarm.swarm.tools.launcher import LocalSwarm

    with tempfile.TemporaryDirectory(prefix="hexswarm-scale-") as tmp, netlab.NetLab(homes=2) as net:
        model_dir = make_tiny_model(Path(tmp) / "model", layers=4, hidden=64, heads=4, kv_heads=2, seed=0)
        # each host in a /24 of its own, as volunteers' machines are, routed by the internet's
        # namespace (on one bridge, the kernel's shared ARP table overflowed at ~32 hosts)
        boot_hosts = [net.add_host(k, own_subnet=True) for k in (1, 2)]
        hosts = [net.add_host(k, own_subnet=True) for k in range(3, n + 4)]  # the last one runs `status`
        status_ns = hosts.pop()[0]
        with LocalSwarm(Path(tmp)) as swarm:
            for k, (ns, ip) in enumerate(boot_hosts):
                joins = ("--initial-peers", *swarm.initial_peers) if swarm.initial_peers else ()
                swarm.start_bootstrap(
                    120, *joins, name=f"bootstrap-{k}", launcher=net.exec_prefix(ns), host_maddrs=ANY,
                    address_prefix=f"/ip4/{ip}/",
                )  # fmt: skip
            torch.zeros(1).share_memory_()  # torch's shm manager out here (see netlab.inside)
            count_rpcs()
            began = time.monotonic()
            nodes = []
            for i, (ns, _) in enumerate(hosts):
                identity = load_or_create_identity(None)
                with netlab.inside(ns):
                    nodes.append((ns, identity, start_dht(swarm.initial_peers, identity, host_maddrs=[ANY])))
                if (i + 1) % 25 == 0:
                    print(f"[scale] {i + 1} of {n} stand-ins joined", file=sys.stderr, flush=True)
            joined_s = time.monotonic() - began
            try:
                line = asyncio.run(
                    _run(n, nodes, boot_hosts, net, status_ns, swarm, joined_s, args, model_dir)
                )
            finally:
                for _, _, dht in nodes:
                    shutdown_dht(dht, 5.0)
            return line


async def _run(n, nodes, boot_hosts, net, status_ns, swarm, joined_s, args, model_dir) -> dict:
    from hexswarm.peer.announcer import Announcer

    peer_ids = [identity.peer_id.to_base58() for _, identity, _ in nodes]
    stop, reads = asyncio.Event(), Reads()
    tasks, record_bytes = [], 0
    for i, (_, identity, dht) in enumerate(nodes):
        addrs = tuple(str(a) for a in dht.get_visible_maddrs())
        others = random.Random(i).sample(peer_ids[:i] + peer_ids[i + 1 :], min(LINKS_EACH, n - 1))
        record = stand_in_record(i, peer_ids[i], addrs, others)
        record_bytes = max(record_bytes, len(record.to_bytes()))
        announcer = Announcer(dht, identity, lambda state, r=record: r, NUM_BLOCKS, args.period)
        if not args.join_only:
            tasks.append(
                asyncio.create_task(
                    run_stand_in(dht, announcer, args.period, args.reads_per_period, stop, reads)
                )
            )
    await asyncio.sleep(args.period)  # every stand-in has announced once
    namespaces = [ns for ns, _ in boot_hosts] + [ns for ns, _, _ in nodes]
    rpcs_before = await asyncio.gather(*(served_rpcs(dht) for _, _, dht in nodes))
    before, began = {ns: host_bytes(ns) for ns in namespaces}, time.monotonic()
    reads.seconds.clear()
    await asyncio.sleep(args.seconds)
    elapsed = time.monotonic() - began
    rates = {ns: (host_bytes(ns) - before[ns]) / elapsed for ns in namespaces}
    rpcs_after = await asyncio.gather(*(served_rpcs(dht) for _, _, dht in nodes))
    rpc_rates = [(a - b) / elapsed for a, b in zip(rpcs_after, rpcs_before, strict=True)]
    read_seconds = list(reads.seconds)  # the window's reads only, not those during `status`
    status_s = await asyncio.to_thread(status_seconds, net, status_ns, swarm.initial_peers)
    newcomer = await asyncio.to_thread(newcomer_figures, net, swarm, model_dir) if args.newcomer else {}
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    stand_ins = [rates[ns] for ns, _, _ in nodes]
    return {
        "peers": n,
        "relayed": 0,
        "clients": 0,
        "period_s": args.period,
        "reads_per_period": args.reads_per_period,
        "joined_s": round(joined_s, 1),
        "record_bytes": record_bytes,
        "largest_value_bytes": reads.largest_value_bytes,
        "upkeep_bytes_per_peer_s": round(statistics.mean(stand_ins)),
        "node_bytes_s_p99": round(_quantile(list(rates.values()), 0.99)),
        "bootstrap_bytes_s": [round(rates[ns]) for ns, _ in boot_hosts],
        "node_rpcs_s_mean": round(statistics.mean(rpc_rates), 2),
        "node_rpcs_s_p99": round(_quantile(rpc_rates, 0.99), 2),
        "reads": len(read_seconds),
        "reads_failed": reads.failed,
        "read_s_p50": _rounded(_quantile(read_seconds, 0.5)),
        "read_s_p99": _rounded(_quantile(read_seconds, 0.99)),
        "status_s": _rounded(status_s),
        **newcomer,
    }


def _quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank `q` quantile of `values` (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def growth_exponent(lines: list[dict], figure: str) -> float | None:
    """The least-squares slope of log(figure) in log(peers) over the runs (None with fewer than two)."""
    points = [(math.log(line["peers"]), math.log(line[figure])) for line in lines if line[figure] > 0]
    if len(points) < 2:
        return None
    mean_x = statistics.mean(x for x, _ in points)
    mean_y = statistics.mean(y for _, y in points)
    spread_x = sum((x - mean_x) ** 2 for x, _ in points)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in points) / spread_x, 3) if spread_x else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[25, 50, 100])
    parser.add_argument("--period", type=float, default=15.0, help="announce period (run-peer's default)")
    parser.add_argument(
        "--reads-per-period", type=int, default=1, help="a stand-in's reads of the model's key a period"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="measured time per N")
    parser.add_argument(
        "--join-only",
        action="store_true",
        help="stand-ins only join the DHT (no announcements, no reads): the transport's own floor",
    )
    parser.add_argument(
        "--newcomer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a real peer joins from behind NAT, and a fresh client generates through it",
    )
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/scale.json")
    parser.add_argument("--save-as", default="scale", help="--save's file name under benchmarks/results/")
    args = parser.parse_args()
    from hexswarm.swarm.nat import netlab

    if why_not := netlab.available():
        sys.exit(f"scale.py needs network namespaces: {why_not}")
    if max(args.peers) > 597:
        sys.exit("at most 597 stand-ins: add_host numbers hosts up to 600 (two bootstraps, one status)")
    started, lines = stamp(), []
    for n in args.peers:
        line = measure(n, args)
        lines.append(line)
        print(json.dumps(line), flush=True)
    summary = {
        "bench": "scale",
        "command": " ".join(sys.argv),
        "join_only": args.join_only,
        "lines": lines,
        "exponent_upkeep": growth_exponent(lines, "upkeep_bytes_per_peer_s"),
        "started": started,
        "ended": stamp(),
    }
    print(json.dumps(summary), flush=True)
    if args.save:
        save(args.save_as, summary)


if __name__ == "__main__":
    main()
