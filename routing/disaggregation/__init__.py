"""Disaggregated prefill and decode (HexGen-2 §3): which GPUs form which replicas, whether each
prefills or decodes, their parallel plans, and where each prefill replica sends its KV caches.
What the coordinator and `hexswarm plan --disaggregated` call; each module stands on the ones
before it, and on the HexGen scheduler's cost model and DP (`routing.scheduler`).

- ``graph`` — the cluster as a graph (memory on nodes, bandwidth on edges, §3.2).
- ``partition`` — step (i): spectral partition into memory-balanced groups, Kernighan–Lin.
- ``roles`` — step (ii): coarsen, secondary partition into prefill and decode, project.
- ``replica`` — step (iii): each group's layout in its role (HexGen's DP) and its capacity.
- ``kv_transfer`` — the KV-cache link between a prefill and a decode replica (Table 1).
- ``flow`` — step (iv): the flow network, max flow by preflow-push, its bottlenecks.
- ``placement`` — a placement evaluated by steps (iii) and (iv), with caches.
- ``refine`` — step (v), §3.4: max-flow-guided swaps (and §5.3's random ones).
- ``plan_record`` — the plan as plain data: replicas, roles, KV routes, dispatch ratios.
- ``planner`` — `plan_disaggregated`, where every search starts.
- ``simulation`` — a plan serving a trace (prefill, KV transfer, decode), a colocated plan
  beside it (``serving_sim``, with the measured interference if given), steady tokens/s.
- ``choice`` — `choose`: the disaggregated or the colocated plan, whichever serves more.
"""
