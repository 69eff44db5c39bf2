"""Seeded inputs for benchmarks and tests: clusters, swarms and churn, drawn or from the papers.

- ``hexgen_clusters`` — the clusters of HexGen's evaluation (§5.1).
- ``hexgen2_settings`` — the heterogeneous settings of HexGen-2's Figure 4 and its workloads.
- ``synthetic_cluster`` — 1,000 consumer and datacenter GPUs in many regions.
- ``churn_process`` — volunteer peers joining and leaving such a swarm.
- ``synthetic_swarm`` — heterogeneous peers as the chain routers see them.
"""
