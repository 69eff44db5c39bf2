"""Simulators that only benchmarks and tests run: a swarm over time, or a plan the solver
itself never simulates.

- ``churn_sim`` — an hour of a churning swarm under one placement policy (``churn_policy``:
  the interface, and hexswarm's coordinator as a policy), its peers' ranges served as disjoint
  chains (``span_chains``).
- ``load_sim`` — many clients routing requests through one swarm with the chain routers.

The serving simulations that score a plan are not here: the genetic search runs one on every
search, live, so it is part of the solver (``routing.scheduler.simulation.serving``), and the coordinator
scores a disaggregated plan against the colocated one before it keeps either, so that
simulation is too (``routing.disaggregation.simulation``, ``routing.disaggregation.choice``).
"""
