"""Pure solvers for hexswarm: plain data in, plain data out (no torch, no network, no I/O).

Two halves, each answering one question:

- ``routing.scheduler`` — *which peer serves which layers, at which TP degree.* HexGen's
  placement search (HexGen, §3–4): GPU catalog and cluster model, the Table 1 / Appendix B
  cost model, the pipeline DP of Algorithm 1, the genetic search of §4.3 (region by region on
  large clusters), the event-driven serving simulator (pipelined, batched) that scores a plan,
  the upper bound on tokens/s a plan is measured against, and the ``Plan`` record the
  coordinator publishes.
- ``routing.chains`` — *which peers one request passes through.* The per-request chain
  routers (Explorative Study, §II): the ``SwarmView`` snapshot and ``Router`` interface, the chain cost
  model, exact min-latency and max-throughput solvers, the NSGA-II trade-off router, and a
  multi-client load simulator used by the benchmarks.

The coordinator, the client and the benchmarks call these with plain data; nothing here
imports torch or opens a socket, so every solver can be unit-tested and timed on its own.
"""
