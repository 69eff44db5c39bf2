"""The coordinator: plans a model's swarm with the genetic scheduler, online
(docs/scheduling.md "The coordinator").

Pure logic (no network): `records` (lease and plan records), `cluster_view` (peer records ->
scheduler cluster), `triggers` (when to re-plan), `moves` (plan -> per-peer assignments with
few moves), `planner` (one call into the scheduler). Transport: `lease` and `service` (DHT glue),
`command` (`hexswarm coordinator`). `plan_command` (`hexswarm plan`) runs the same search once,
offline, over a cluster file.
"""
