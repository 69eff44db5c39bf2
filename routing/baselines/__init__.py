"""What the benchmarks compare hexswarm's solvers with; no live swarm calls these.

- ``petals_policy`` / ``petals_server`` — Petals' rule as Petals' servers run it (the churn
  benchmark), and no re-planning at all. The part of Petals' rule a live peer follows without a
  coordinator is the solver's (``routing.scheduler.petals_rule``).
- ``table4`` — the plan HexGen reported for its full-price cluster (Table 4).
- ``symmetric`` — HexGen's baseline ii: stages share one TP degree and equal layer counts.
- ``matrix_nsga`` — NSGA-II with the Explorative Study's bit-matrix encoding of chains.
- ``reference_front`` — the epsilon-constraint sweep's front of chains, and the hypervolume
  that measures a front against it.
"""
