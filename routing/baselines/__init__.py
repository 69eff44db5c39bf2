"""What the benchmarks compare hexswarm's solvers with; no live swarm calls these.

- ``petals_policy`` / ``petals_server`` — Petals' rule as Petals' servers run it (the churn
  benchmark), and no re-planning at all. The part of Petals' rule a live peer follows without a
  coordinator is the solver's (``routing.scheduler.petals_rule``).
- ``table4`` — the plan HexGen reported for its full-price cluster (Table 4).
- ``reference_front`` — the epsilon-constraint sweep's front of chains, and the hypervolume
  that measures a front against it.
"""
