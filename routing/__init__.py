"""Pure solvers for hexswarm: plain data in, plain data out (no torch, no network, no I/O).

The solvers, what a live swarm calls:

- ``routing.scheduler`` — *which peer serves which layers, at which TP degree.* HexGen's
  placement search (HexGen, §3–4): GPU catalog and cluster model, the Table 1 / Appendix B
  cost model, the pipeline DP of Algorithm 1, the serving simulation, analytic estimate and
  bounds that score a plan, the genetic search of §4.3 (region by region on large clusters,
  around pinned stages), re-planning with the cost of moves, Petals' rule for peers without a
  coordinator, and the ``Plan`` record the coordinator publishes.
- ``routing.disaggregation`` — *which replicas prefill and which decode, and where the KV cache
  goes.* HexGen-2's scheduler (§3): spectral and Kernighan–Lin partition, the secondary
  partition into prefill and decode, each replica laid out with HexGen's DP, max flow by
  preflow-push, max-flow-guided swaps, and the plan with its dispatch ratios; the simulation
  that serves a trace with it (and with a colocated plan beside it), and the choice between
  the two that the coordinator makes.
- ``routing.chains`` — *which peers one request passes through.* The per-request chain
  routers (Explorative Study, §II): the ``SwarmView`` snapshot and ``Router`` interface, the
  chain cost model, exact min-latency and max-throughput solvers, and the NSGA-II trade-off
  router.

What only the benchmarks and tests use, standing on the solvers and never under them
(tests/unit/test_layering.py keeps it so):

- ``routing.scenarios`` — seeded inputs: HexGen's clusters, HexGen-2's settings and workloads,
  synthetic clusters and swarms, churn processes.
- ``routing.sim`` — simulators of a swarm over time: churn, many clients under load.
- ``routing.baselines`` — what the solvers are compared with: Petals' rule as Petals runs it,
  HexGen's Table 4 plan and symmetric pipelines, the study's NSGA-II encoding, the reference
  front of chains.

The coordinator, the client and the benchmarks call these with plain data; nothing here
imports torch or opens a socket, so every solver can be unit-tested and timed on its own.
"""
