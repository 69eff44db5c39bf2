"""What each periodic DHT operation of the control plane costs, in calls and bytes, over N nodes.

A swarm's upkeep is mostly DHT searches: a search asks nodes one after another, and each node
answers with the values it holds and up to 20 neighbours per key (hivemind's bucket size). This
counts, for one operation at a time, the DHT calls every node of the swarm served (`rpc_find`,
`rpc_store`) and the bytes of their requests and replies (protobuf sizes: the transport's framing
comes on top), so the figures are exact counts, not timings, and no machine noise enters them.

N real hivemind DHT nodes (each its process and p2pd) on 127.0.0.1, every node's record of one
model stored first (2.6 kB each, as a record with its round trips is), then each operation run
`--repeats` times from different nodes:
- `announce`: one key stored as a peer stores its record (swarm/net/replicas.py `store_own`);
- `window`: a serving peer's period read (SHARDS_PER_PERIOD record keys, swarm/trust/record_window.py);
- `coordinator_window`: the lease holder's watch-period read (WATCH_SHARDS keys);
- `whole`: all 32 record keys (a peer's first read, `status`, a range move's check);
- `shard`: one record key (a push to a peer not yet known, peer/push.py);
- `near_key` / `every_node_key`: one small key read from the nodes nearest it, or from every
  node of a 20-node beam (the lease and plan reads; swarm/net/dht_read.py).

One JSON line per N: for each operation the mean calls and kB per run. Run:
python benchmarks/dht_costs.py --nodes 12 24 48
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import typing
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import stamp, summarize  # noqa: E402

MODEL_ID = "dht-costs-model"
RECORD_BYTES = 2600
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
COUNTED = ("rpc_find", "rpc_store")

# calls and bytes each node served, shared with the DHT processes (forked after this is made)
served = mp.Array("d", 2 * len(COUNTED))


def count_served_calls() -> None:
    """Wraps hivemind's DHT handlers so that every node forked after this counts what it serves."""
    import hivemind.dht.protocol as protocol

    for index, name in enumerate(COUNTED):
        handler = getattr(protocol.DHTProtocol, name)

        async def counted(self, request, context, _handler=handler, _index=index):
            response = await _handler(self, request, context)
            with served.get_lock():
                served[_index] += 1
                served[len(COUNTED) + _index] += request.ByteSize() + response.ByteSize()
            return response

        # hivemind registers handlers by their annotations (strings, resolved where they are written)
        counted.__annotations__ = typing.get_type_hints(handler)
        setattr(protocol.DHTProtocol, name, counted)


def cost_of(operation, repeats: int) -> dict:
    """Mean calls of each kind and kB a run of `operation(run)` made the swarm serve."""
    before = list(served[:])
    for run in range(repeats):
        operation(run)
    time.sleep(0.5)  # the last replies are counted as they are sent
    spent = [after - was for after, was in zip(served[:], before, strict=True)]
    calls = {name.removeprefix("rpc_"): round(spent[i] / repeats, 1) for i, name in enumerate(COUNTED)}
    return {**calls, "kB": round(sum(spent[len(COUNTED) :]) / repeats / 1000, 1)}


def measure(n: int, repeats: int) -> dict:
    from hexswarm.swarm.coordinator.service import WATCH_SHARDS
    from hexswarm.swarm.net import replicas
    from hexswarm.swarm.net.dht import start_dht
    from hexswarm.swarm.net.dht_read import get_latest, get_many_latest
    from hexswarm.swarm.net.identity import load_or_create_identity
    from hexswarm.swarm.trust.record_keys import RECORD_SHARDS, record_key, record_keys
    from hexswarm.swarm.trust.record_window import SHARDS_PER_PERIOD

    identities = [load_or_create_identity(None) for _ in range(n)]
    nodes = [start_dht([], identities[0], host_maddrs=[LOOPBACK])]
    initial_peers = [str(a) for a in nodes[0].get_visible_maddrs()]
    nodes += [start_dht(initial_peers, identity, host_maddrs=[LOOPBACK]) for identity in identities[1:]]
    try:
        keys = record_keys(MODEL_ID)

        def announce(run: int) -> None:
            k = run % n
            store = partial(
                replicas._store_in_node,
                record_key(MODEL_ID, identities[k].peer_id.to_base58()),
                identities[k].owner_marker,
                b"r" * RECORD_BYTES,
                time.time() + 300,
            )
            nodes[k].run_coroutine(store, return_future=True).result(30)

        def read(count: int, run: int) -> None:
            first = (count * run) % RECORD_SHARDS
            get_many_latest(nodes[run % n], [keys[(first + i) % RECORD_SHARDS] for i in range(count)], 10)

        for k in range(n):  # every node's record in place: keys hold N/32 records each
            announce(k)
        small_key = f"hexswarm/v1/coordinator/{MODEL_ID}"
        operations = {
            "announce": announce,
            "window": partial(read, SHARDS_PER_PERIOD),
            "coordinator_window": partial(read, WATCH_SHARDS),
            "whole": partial(read, RECORD_SHARDS),
            "shard": partial(read, 1),
            "near_key": lambda run: get_latest(nodes[run % n], small_key, 10, every_node=False),
            "every_node_key": lambda run: get_latest(nodes[run % n], small_key, 10, every_node=True),
        }
        line = {"nodes": n, "repeats": repeats}
        for name, operation in operations.items():
            line[name] = cost_of(operation, repeats)
            print(f"[dht_costs] {n} nodes: {name} {line[name]}", file=sys.stderr, flush=True)
        return line
    finally:
        for node in nodes:
            node.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[12, 24, 48])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/dht_costs.json")
    args = parser.parse_args()
    count_served_calls()
    started, lines = stamp(), []
    for n in args.nodes:
        lines.append(measure(n, args.repeats))
        print(json.dumps(lines[-1]), flush=True)
    summarize("dht_costs", sys.argv, lines, started, args.save)


if __name__ == "__main__":
    main()
