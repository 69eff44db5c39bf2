"""The churn benchmark's baselines: Petals' rule, and no re-planning at all.

Both answer the interface of `routing/sim/churn_policy.py` (a `SwarmView` in, a `Decision` out).

* `PetalsPolicy` — Petals' rule (`petals_rule.py`, Petals 2.2.0): a joining server takes the
  blocks with the least announced throughput, as many as its memory holds; once loaded, each
  server checks after a uniform wait (mean `period_s`, 120 s) whether moving would raise the
  swarm's weakest block enough, and a server that moves restarts and loads all its new blocks.
  `server_gpus=1` runs one server per GPU, as Petals does by default (`tensor_parallel_devices`
  defaults to the one device; its TP is tested on BLOOM only, and its maintainers advise one
  server per GPU); `server_gpus=0` grants each machine one server over its largest
  power-of-two TP group, as if Petals' TP worked for the model; `server_gpus=k` one such server
  per k GPUs. A server is named by its first device, so every server of a machine leaves with it.
  How many blocks a server takes and what it announces are Petals' server code
  (`petals_server.py`).
* `StaticPolicy` — no re-planning: the initial plan stays; leaving peers just vanish; joining
  peers take Petals' join placement (they are not left idle) but nobody ever moves.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

from hexswarm.routing.baselines.petals_server import announced_throughput, network_rps, server_num_blocks
from hexswarm.routing.scheduler.cluster import DEFAULT_SAME_REGION, Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.petals_rule import (
    DEFAULT_BALANCE_QUALITY,
    MEAN_BALANCE_CHECK_PERIOD_S,
    Span,
    check_delay,
    choose_start,
    should_move,
)
from hexswarm.routing.scheduler.pipeline_layout.algorithm1 import TP_DEGREES
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.sim.churn_policy import Decision, SwarmView, plan_spans
from hexswarm.routing.sim.span_chains import PeerSpan


def petals_servers(
    machine: str, devices: tuple[str, ...], server_gpus: int = 0
) -> dict[str, tuple[str, ...]]:
    """The Petals servers a machine runs: name -> its devices. `server_gpus` 0: one server over
    the whole machine; k: one server per k GPUs (the last takes the rest; 1 is Petals' default).
    A server is named by its first device, so the names stay unique across machines."""
    if server_gpus == 0:
        return {machine: devices}
    groups = [devices[k : k + server_gpus] for k in range(0, len(devices), server_gpus)]
    return {group[0]: group for group in groups}


def petals_span(model: ModelSpec, workload: Workload, cluster: Cluster, devices: tuple[str, ...]) -> tuple:
    """A Petals server over these devices: its TP group (largest power of two of them), the
    blocks it fills its memory with, and the throughput it announces (`petals_server.py`: the
    forward rate of one block, compute bound as Petals measures it with 1024-token batches,
    over (blocks + 1) / 2, capped by its region link's rate). `workload` is unused: Petals sizes
    its attention cache by its own defaults."""
    del workload
    t = max(k for k in TP_DEGREES if k <= len(devices))
    group = tuple(devices[:t])
    specs = [cluster.devices[cluster.index(d)] for d in group]
    length = min(
        model.num_layers,
        server_num_blocks(
            min(d.memory_bytes for d in specs),
            t,
            model.layer_bytes,
            model.hidden_size,
            model.kv_width,
            model.dtype_bytes,
        ),
    )
    if length < 1:
        return group, 0, 0.0
    forward_rps = t * min(d.flops for d in specs) / (2.0 * model.params_per_layer)
    link = (cluster.network.same_region if cluster.network else DEFAULT_SAME_REGION).bandwidth
    return group, length, announced_throughput(forward_rps, length, network_rps(8 * link, model.hidden_size))


class PetalsPolicy:
    """Petals' rule (module docstring); `rebalance=False` keeps only its join placement;
    `server_gpus` is 0 (one TP server per machine), 1 (one server per GPU, Petals' default) or
    k (one TP server per k GPUs of a machine)."""

    name = "petals"

    def __init__(
        self,
        model: ModelSpec,
        workload: Workload,
        period_s: float = MEAN_BALANCE_CHECK_PERIOD_S,
        balance_quality: float = DEFAULT_BALANCE_QUALITY,
        seed: int = 0,
        rebalance: bool = True,
        server_gpus: int = 0,
    ):
        if isinstance(server_gpus, bool) or not isinstance(server_gpus, int) or server_gpus < 0:
            raise ValueError(f"server_gpus must be an integer >= 0, not {server_gpus!r}")
        if server_gpus:
            self.name = "petals-gpu" if server_gpus == 1 else f"petals-{server_gpus}gpu"
        self.server_gpus = server_gpus
        self.model, self.workload, self.period_s = model, workload, period_s
        self.balance_quality, self.rebalance = balance_quality, rebalance
        self.rng = random.Random(seed)
        self.seen: set[str] = set()  # peers that have chosen their blocks once
        self.next_check: dict[str, float] = {}  # loaded peers -> their next balance check
        self.throughput: dict[str, float] = {}

    def decide(self, view: SwarmView) -> Decision:
        spans = dict(view.spans)
        changes: dict[str, PeerSpan] = {}
        offered = {
            server: devices
            for machine, machine_devices in view.machines.items()
            for server, devices in petals_servers(machine, machine_devices, self.server_gpus).items()
        }
        newcomers = [s for s in offered if s not in spans and s not in self.seen]
        self.rng.shuffle(newcomers)
        for server in newcomers:
            self.seen.add(server)
            group, length, throughput = petals_span(self.model, self.workload, view.cluster, offered[server])
            if length < 1:
                continue  # too small to hold one block: this server cannot serve
            self.throughput[server] = throughput
            start = choose_start(self.model.num_layers, self._spans(spans), length)
            spans[server] = changes[server] = PeerSpan(server, group, start, start + length)
        if self.rebalance:
            for machine in sorted(spans):
                if self._check_due(machine, view) and (start := self._check(spans, machine)) is not None:
                    old = spans[machine]
                    spans[machine] = changes[machine] = replace(old, start=start, end=start + old.layers)
                    del self.next_check[machine]  # the next wait starts once the new blocks are loaded
        return Decision(changes, full_reload=frozenset(changes))

    def _check_due(self, machine: str, view: SwarmView) -> bool:
        """Whether this peer runs its balance check now (Petals' Server.run: a uniform wait,
        counted from the moment its blocks are loaded, and again after each check)."""
        if machine not in view.loaded:
            self.next_check.pop(machine, None)
            return False
        if machine not in self.next_check:
            self.next_check[machine] = view.now_s + check_delay(self.rng, self.period_s)
        if self.next_check[machine] > view.now_s:
            return False
        self.next_check[machine] = view.now_s + check_delay(self.rng, self.period_s)
        return True

    def _check(self, spans: Mapping[str, PeerSpan], machine: str) -> int | None:
        order = sorted(spans)
        return should_move(
            self.model.num_layers,
            self._spans(spans, order),
            order.index(machine),
            self.balance_quality,
            self.rng,
        )

    def _spans(self, spans: Mapping[str, PeerSpan], order: list[str] | None = None) -> list[Span]:
        order = sorted(spans) if order is None else order
        return [Span(spans[m].start, spans[m].layers, self.throughput.get(m, 1.0)) for m in order]


class StaticPolicy(PetalsPolicy):
    """No re-planning (module docstring): the initial plan, then Petals' join placement only
    (joiners run servers of `server_gpus` GPUs, as the plan's peers do)."""

    name = "no-replan"

    def __init__(
        self, model: ModelSpec, workload: Workload, initial: Plan, seed: int = 0, server_gpus: int = 0
    ):
        super().__init__(model, workload, seed=seed, rebalance=False, server_gpus=server_gpus)
        self.name = StaticPolicy.name
        self.initial, self.started = initial, False

    def decide(self, view: SwarmView) -> Decision:
        if self.started:
            return super().decide(view)
        self.started = True
        spans = plan_spans(view.cluster, self.initial)
        for peer in spans:  # announced as Petals would, so that joiners weigh them alike
            devices = tuple(d.id for d in view.cluster.devices if d.machine == peer)
            _, _, self.throughput[peer] = petals_span(self.model, self.workload, view.cluster, devices)
        # peers the plan left idle stay idle, as in the plan
        for machine, devices in view.machines.items():
            self.seen.update(petals_servers(machine, devices, self.server_gpus))
        return Decision(spans)
