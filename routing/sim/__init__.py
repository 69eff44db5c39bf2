"""Simulators that only benchmarks and tests run: a swarm over time, or a plan the solver
itself never simulates.

- ``churn_sim`` — an hour of a churning swarm under one placement policy (``churn_policy``:
  the interface, and hexswarm's coordinator as a policy), its peers' ranges served as disjoint
  chains (``span_chains``).
- ``load_sim`` — many clients routing requests through one swarm with the chain routers.
- ``disaggregated`` — a HexGen-2 plan serving a trace: prefill replicas, KV transfers, decode
  replicas; and HexGen's colocated plan on the same trace (``serving_sim``, interference
  included), for the disaggregation benchmark.

The serving simulation that scores a plan is not here: the genetic search runs it on every
search, live, so it is part of the solver (``routing.scheduler.serving``). HexGen-2's planner
scores its plans by their max flow alone, so the simulation of a disaggregated plan is here.
"""
