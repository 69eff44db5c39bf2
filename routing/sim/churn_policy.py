"""Who serves which layers while peers come and go: the three policies of the churn benchmark.

A policy sees the swarm (`SwarmView`) at every join or leave and every few seconds, and answers
with the peers whose range changes (`Decision`). The simulator (`churn_sim.py`) applies the
changes: a peer that gets a new range loads it (`moves.load_seconds`) and serves nothing meanwhile.
The interface is this one method so that the live coordinator's own decision logic can be
plugged in later.

* `CoordinatorPolicy` — hexswarm's coordinator: after a join or leave it waits `debounce_s` (a
  burst of events makes one re-plan), and it re-plans every `period_s` anyway, then re-opening
  one region in turn; each re-plan is `replan.replan` (the genetic search warm-started, moves
  costed), published only when its estimate beats the current plan's by the margin. Peers the
  plan leaves out keep their range.
* `PetalsPolicy` — Petals' rule (`petals_rule.py`, Petals 2.2.0): a joining server takes the
  blocks with the least announced throughput, as many as its memory holds; once loaded, each
  server checks after a uniform wait (mean `period_s`, 120 s) whether moving would raise the
  swarm's weakest block enough, and a server that moves restarts and loads all its new blocks.
  `server_gpus=1` runs one server per GPU, as Petals does by default (`tensor_parallel_devices`
  defaults to the one device; its TP is tested on BLOOM only, and its maintainers advise one
  server per GPU); `server_gpus=0` grants each machine one server over its largest
  power-of-two TP group, as if Petals' TP worked for the model; `server_gpus=k` one such server
  per k GPUs. A server is named by its first device, so every server of a machine leaves with it.
* `StaticPolicy` — no re-planning: the initial plan stays; leaving peers just vanish; joining
  peers take Petals' join placement (they are not left idle) but nobody ever moves.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from routing.scheduler.algorithm1 import TP_DEGREES
from routing.scheduler.cluster import DEFAULT_SAME_REGION, Cluster
from routing.scheduler.model_spec import ModelSpec, Workload
from routing.scheduler.moves import Assignment
from routing.scheduler.petals_rule import (
    DEFAULT_BALANCE_QUALITY,
    MEAN_BALANCE_CHECK_PERIOD_S,
    Span,
    announced_throughput,
    check_delay,
    choose_start,
    network_rps,
    server_num_blocks,
    should_move,
)
from routing.scheduler.plan import Plan
from routing.scheduler.replan import REPLAN_CONFIG, MoveCosts, plan_assignments, replan
from routing.scheduler.span_chains import PeerSpan


@dataclass(frozen=True)
class SwarmView:
    """What a policy sees: the peers present, the ranges they hold, and what changed since."""

    now_s: float
    cluster: Cluster  # the present peers' devices
    machines: Mapping[str, tuple[str, ...]]  # present peer -> its device ids
    spans: Mapping[str, PeerSpan]  # present peers' ranges (loading or serving)
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    loaded: frozenset[str] = frozenset()  # present peers whose range is loaded (serving)


@dataclass(frozen=True)
class Decision:
    spans: dict[str, PeerSpan] = field(default_factory=dict)  # peers whose range changes
    replan_s: float | None = None  # wall time of a re-plan made for this decision
    replan_cpu_s: float | None = None  # its CPU time
    full_reload: frozenset[str] = frozenset()  # changed peers that reload every layer (Petals restarts)


class Policy(Protocol):
    name: str

    def decide(self, view: SwarmView) -> Decision: ...


def plan_spans(cluster: Cluster, plan: Plan) -> dict[str, PeerSpan]:
    """Peer -> range under a plan (one stage per machine), for the peers present in `cluster`."""
    return {
        machine: PeerSpan(machine, stage.device_ids, stage.start, stage.end)
        for machine, stage in plan_assignments(cluster, plan).items()
    }


class CoordinatorPolicy:
    """hexswarm's coordinator (module docstring)."""

    name = "coordinator"

    def __init__(
        self,
        model: ModelSpec,
        workload: Workload,
        initial: Plan,
        costs: MoveCosts | None = None,
        config=REPLAN_CONFIG,
        debounce_s: float = 20.0,
        period_s: float = 120.0,
        reopen_regions: int = 1,
    ):
        self.model, self.workload, self.costs, self.config = model, workload, costs or MoveCosts(), config
        self.plan, self.debounce_s, self.period_s = initial, debounce_s, period_s
        self.pending: float | None = None
        self.last = 0.0
        self.known: frozenset[str] = frozenset()
        self.cache: dict = {}
        self.started = False
        self.turn = 0  # the region a periodic re-plan re-opens next
        self.reopen_regions = reopen_regions  # how many regions a periodic re-plan re-opens

    def decide(self, view: SwarmView) -> Decision:
        if not self.started:  # t = 0: the initial plan, searched before the run
            self.started, self.known = True, frozenset(view.cluster.ids)
            return Decision(plan_spans(view.cluster, self.plan))
        if view.joined or view.left:
            self.pending = view.now_s if self.pending is None else self.pending
        due = self.pending is not None and view.now_s >= self.pending + self.debounce_s
        periodic = view.now_s >= self.last + self.period_s
        if not due and not periodic:
            return Decision()
        reopen = ()
        if periodic and not due:  # re-open one region in turn (`replan.replan`)
            regions = sorted({d.region for d in view.cluster.devices})
            count = min(self.reopen_regions, len(regions))
            reopen = tuple(regions[(self.turn + k) % len(regions)] for k in range(count))
            self.turn += count
        current = {m: Assignment(s.device_ids, s.start, s.end) for m, s in view.spans.items()}
        result = replan(
            view.cluster,
            self.model,
            self.workload,
            self.plan,
            self.config,
            self.costs,
            current=current,
            known=self.known,
            layout_cache=self.cache,
            reopen=reopen,
        )
        self.pending, self.last, self.known = None, view.now_s, frozenset(view.cluster.ids)
        if not result.publish:
            return Decision(replan_s=result.elapsed_s, replan_cpu_s=result.cpu_s)
        self.plan = result.plan
        spans = plan_spans(view.cluster, result.plan)
        changes = {m: s for m, s in spans.items() if view.spans.get(m) != s}
        return Decision(changes, result.elapsed_s, result.cpu_s)


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
    blocks it fills its memory with, and the throughput it announces (`petals_rule.py`: the
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
