"""HexGen's baseline ii (§5.1): symmetric pipelines, every stage of one TP degree and the same
number of layers.

`SymmetricDP` is Algorithm 1 (`routing.scheduler.pipeline_layout.pipeline_dp.PipelineDP`) restricted to such
layouts: for each TP degree t alone and each number of stages S, the DP with the even layer rule
(stage j gets layers [round(jL/S), round((j+1)L/S))), and no re-fit of the layer split after it.
The genetic search uses it in place of the full DP with `SearchConfig(layout_dp=SymmetricDP)`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hexswarm.routing.scheduler.pipeline_layout.algorithm1 import TP_DEGREES, Tables
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, StageLayout


class SymmetricDP(PipelineDP):
    """Lays out a group as the best symmetric pipeline (module docstring)."""

    def searches(self, num_devices: int, states: int) -> list[tuple[str, int, Sequence[int]]]:
        top = min(self.max_stages, num_devices, self.model.num_layers)
        return [("even", s, (t,)) for t in TP_DEGREES for s in range(1, top + 1)]

    def layer_splits(self, stages: list[StageLayout], tables: Tables, path) -> list[list[int]]:
        return [[s.layers for s in stages]]  # the even split the DP chose: equal layer counts
