"""The layout of one pipeline: HexGen §4.2, Algorithm 1 (DP over GPU-set vectors), and the
layer-partition step of §4.3 ("even partition, then proportional to stage memory").

Heuristic of §4.2: a TP group uses one GPU type on one machine. We call such a class of
interchangeable devices a *bucket* (same machine, type and figures), so a set of devices is a
vector tau of per-bucket counts, exactly the paper's tau with "type" refined by machine, and a
stage is t devices of one bucket with t in {1, 2, 4, 8}.

Eq. 3 sums stage costs, but the PP hop of Eq. 6 couples consecutive stages, so the DP state is
(tau, bucket of the last stage) and, for a layer split that depends on the stage index, j:

    DP[j; tau, k] = min over stages (k', t) of  DP[j-1; tau - t e_k', k] + C_comp + C_comm-tp
                                                + C_comm-pp(k -> k')

computed backwards with memoization (the same recursion as Algorithm 1; `algorithm1.py`
holds the tables and the recursion, this module the layout search around them). Layer counts:
  * "even":         S stages, stage j gets layers [round(jL/S), round((j+1)L/S))  (§4.3 start);
  * "proportional": every device of the group is used and a stage gets the layers of its share
                    of the group's memory, a function of tau alone (the fixed point of §4.3's
                    EM step; it finds layouts such as Norway's [2,1,1,2] where even splits OOM).
After the DP the layer split is re-fitted (`layer_split.py`): proportional to stage memory
(§4.3), the latency-optimal split under the memory caps, and, when layouts are scored for
throughput, the split balanced to stage speed; the best feasible layout under the score wins
(Eq. 2 latency by default). Infeasible stages (Eq. 7 > M_d) cost +inf (§4.2 footnote 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import StageSpec, pipeline_cost, weight_memory
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.algorithm1 import TP_DEGREES, Tables, dp
from hexswarm.routing.scheduler.pipeline_layout.layer_split import (
    balanced_split,
    greedy_split,
    proportional_split,
)

MAX_DP_STATES = 800  # tau vectors; bigger groups are rejected before the DP (§4.3 early checks)
EVEN_DP_STATES = 100  # the per-S "even" DPs run only for groups this small (they cost S times more)
MAX_EVEN_STAGES = 8
THROUGHPUT_DEGREES = ((2,), (1, 2), (2, 4), (4,))  # DP runs when the score is throughput
# (and (1,), all TP 1, when there is no deadline: the layout that pays no all-reduce at all)


@dataclass(frozen=True)
class StageLayout:
    """A stage: device indices into the cluster (a TP group) serving layers [start, end)."""

    devices: tuple[int, ...]
    start: int
    end: int

    @property
    def layers(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PipelineLayout:
    """A pipeline's stages with its cost (Eq. 2) for a request of mean prompt length."""

    stages: tuple[StageLayout, ...]
    prefill_s: float
    decode_s: float

    @property
    def latency_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for stage in self.stages for d in stage.devices)


def bucket_key(cluster: Cluster, index: int) -> tuple:
    """Devices with equal keys are interchangeable for the cost model."""
    d = cluster.devices[index]
    return (
        d.region,
        d.machine,
        d.type,
        d.memory_bytes,
        d.bandwidth,
        d.flops,
        d.quant,
        d.weight_bytes_per_layer,
    )


def dp_states(counts: Sequence[int], whole_buckets: bool = False) -> int:
    """Size of the DP's tau space: prod(count + 1), or 2^buckets when a bucket is used whole."""
    states = 1
    for count in counts:
        states *= 2 if whole_buckets else count + 1
    return states


def buckets_of(cluster: Cluster, devs: Sequence[int]) -> list[tuple[int, ...]]:
    """Splits device indices into buckets, in a canonical order."""
    groups: dict[tuple, list[int]] = {}
    for i in sorted(devs):
        groups.setdefault(bucket_key(cluster, i), []).append(i)
    return [tuple(groups[k]) for k in sorted(groups)]


def _resplit(stages: list[StageLayout], splits: list[int]) -> list[StageLayout]:
    out, start = [], 0
    for stage, n in zip(stages, splits, strict=False):
        if n > 0:
            out.append(StageLayout(stage.devices, start, start + n))
            start += n
    return out


def _instantiate(buckets: list[tuple[int, ...]], path) -> list[StageLayout]:
    """Turns (bucket, degree, start, end) steps into stages with concrete devices."""
    taken = [0] * len(buckets)
    stages = []
    for k, t, start, end in path:
        stages.append(StageLayout(buckets[k][taken[k] : taken[k] + t], start, end))
        taken[k] += t
    return stages


class PipelineDP:
    """Finds the cheapest layout of a device group (Alg. 1 + §4.3 partition), with a cache.

    Groups with the same bucket vector get the same layout, so the genetic search, which
    re-evaluates such groups constantly, pays for each DP once. A subclass may restrict the
    layouts it tries (`searches`, `layer_splits`), as HexGen's symmetric baseline does
    (routing/baselines/symmetric.py).
    """

    def __init__(
        self,
        cluster: Cluster,
        model: ModelSpec,
        workload: Workload,
        max_stages: int = 16,
        score: Callable[[PipelineLayout], tuple] | None = None,
        cache: dict | None = None,
        whole_buckets: bool = False,
    ):
        self.cluster, self.model, self.workload = cluster, model, workload
        self.max_stages = max_stages
        self.whole_buckets = whole_buckets  # swarm: one stage per bucket at most (`algorithm1.dp`)
        # Lower is better. None: Eq. 2 latency (one request alone, the sequential model). With
        # pipelining and batching the caller passes a throughput-within-SLO score, and the DP
        # also tries layouts with fewer TP degrees and splits balanced for throughput.
        self.score = score
        # Layouts per bucket vector. A caller may pass the dict of an earlier search on the same
        # network (a re-plan after devices left): buckets name their machine and region, so a
        # cached layout stays valid on any subset of the cluster.
        self._cache: dict[tuple, PipelineLayout | None] = {} if cache is None else cache
        lengths = replace(workload, rate=1.0, num_requests=1, seed=0)  # what layouts depend on
        # type(self): a subclass that searches other layouts (a baseline's) never shares an entry
        self._mode = (model, lengths, type(self), max_stages, score is None, whole_buckets)

    def layout(self, devs: Sequence[int]) -> PipelineLayout | None:
        """The best layout for a group, or None when it cannot hold a replica."""
        buckets = buckets_of(self.cluster, devs)
        key = (self._mode, tuple((bucket_key(self.cluster, bk[0]), len(bk)) for bk in buckets))
        if key not in self._cache:
            self._cache[key] = self._template(self._solve(buckets))
        template = self._cache[key]
        return None if template is None else self._rebind(template, buckets)

    def _template(self, layout: PipelineLayout | None):
        """A layout with each stage as (bucket key, degree, start, end): valid on any cluster."""
        if layout is None:
            return None
        stages = tuple(
            (bucket_key(self.cluster, s.devices[0]), len(s.devices), s.start, s.end) for s in layout.stages
        )
        return stages, layout.prefill_s, layout.decode_s

    def dp_path(
        self, devs: Sequence[int], rule: str, num_stages: int = 0, degrees: Sequence[int] = TP_DEGREES
    ) -> tuple[float, list[StageLayout]]:
        """The raw Algorithm 1 optimum for one layer rule (exposed for tests against brute force)."""
        buckets = buckets_of(self.cluster, devs)
        tables = Tables(self.cluster, buckets, self.model, self.workload)
        cost, path = dp(tables, self.model.num_layers, rule, num_stages, degrees, self.whole_buckets)
        return cost, _instantiate(buckets, path)

    def _solve(self, buckets: list[tuple[int, ...]]) -> PipelineLayout | None:
        states = dp_states([len(bk) for bk in buckets], self.whole_buckets)
        if states > MAX_DP_STATES:
            return None
        tables = Tables(self.cluster, buckets, self.model, self.workload)
        best: PipelineLayout | None = None
        for rule, stages_count, degrees in self.searches(sum(tables.counts), states):
            _, path = dp(tables, self.model.num_layers, rule, stages_count, degrees, self.whole_buckets)
            if not path:
                continue
            stages = _instantiate(buckets, path)
            for candidate in self._refits(stages, tables, path):
                if best is None or self._key(candidate) < self._key(best):
                    best = candidate
        return best

    def _key(self, layout: PipelineLayout) -> tuple:
        return (layout.latency_s,) if self.score is None else self.score(layout)

    def searches(self, num_devices: int, states: int) -> list[tuple[str, int, Sequence[int]]]:
        """The DP runs to try: (layer rule, number of stages or 0 for any, TP degrees allowed)."""
        top = min(self.max_stages, num_devices, self.model.num_layers)
        searches = [("proportional", 0, TP_DEGREES)]
        if self.score is not None:  # narrower TP groups in more stages: less all-reduce per step
            degrees = THROUGHPUT_DEGREES if self.workload.has_deadline else ((1,),) + THROUGHPUT_DEGREES
            return searches + [("proportional", 0, d) for d in degrees]
        if states <= EVEN_DP_STATES:
            searches += [("even", s, TP_DEGREES) for s in range(1, min(top, MAX_EVEN_STAGES) + 1)]
        return searches

    def layer_splits(self, stages: list[StageLayout], tables: Tables, path) -> list[list[int]]:
        """Layer counts to try on the DP's stages: the DP's own split, then the splits of
        `layer_split.py` (balanced only for throughput)."""
        memory = [sum(weight_memory(self.cluster.devices[d], self.model) for d in s.devices) for s in stages]
        unit = [tables.unit[k, t] for k, t, _, _ in path]
        caps = [tables.cap[k, t] for k, t, _, _ in path]
        splits = [[s.layers for s in stages]]
        splits.append(proportional_split(memory, self.model.num_layers))
        splits.append(greedy_split(unit, caps, self.model.num_layers))
        if self.score is not None:
            splits.append(balanced_split(unit, caps, self.model.num_layers))
        return [split for split in splits if split is not None]

    def _refits(self, stages: list[StageLayout], tables: Tables, path) -> list[PipelineLayout]:
        """The stages under each of `layer_splits` that fits their memory caps."""
        out = []
        for split in self.layer_splits(stages, tables, path):
            caps_ok = all(n <= tables.cap[k, t] for n, (k, t, _, _) in zip(split, path, strict=False))
            if caps_ok and sum(split) == self.model.num_layers:
                out.append(self.evaluate(_resplit(stages, split)))
        return out

    def evaluate(self, stages: Sequence[StageLayout]) -> PipelineLayout:
        """Eq. 2 for given stages at the workload's mean prompt length."""
        w = self.workload
        specs = [StageSpec(s.devices, s.layers) for s in stages]
        cost = pipeline_cost(self.cluster, specs, self.model, float(w.s_in), w.s_out, w.batch_size)
        return PipelineLayout(tuple(stages), float(cost.prefill), float(cost.decode))

    def _rebind(self, template, buckets: list[tuple[int, ...]]) -> PipelineLayout:
        """Maps a cached template onto this group's own devices (same buckets, other members)."""
        position = {bucket_key(self.cluster, bk[0]): bk for bk in buckets}
        taken: dict[tuple, int] = {}
        stages = []
        template_stages, prefill_s, decode_s = template
        for key, degree, start, end in template_stages:
            bk, n = position[key], taken.get(key, 0)
            stages.append(StageLayout(bk[n : n + degree], start, end))
            taken[key] = n + degree
        return PipelineLayout(tuple(stages), prefill_s, decode_s)
