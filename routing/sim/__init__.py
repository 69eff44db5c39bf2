"""Simulators that only benchmarks and tests run: a swarm over time, not a plan.

- ``churn_sim`` — an hour of a churning swarm under one placement policy (``churn_policy``:
  the interface, and hexswarm's coordinator as a policy), its peers' ranges served as disjoint
  chains (``span_chains``).
- ``load_sim`` — many clients routing requests through one swarm with the chain routers.

The serving simulation that scores a plan is not here: the genetic search runs it on every
search, live, so it is part of the solver (``routing.scheduler.serving``).
"""
