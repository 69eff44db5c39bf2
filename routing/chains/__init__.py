"""Per-request routing: which chain of peers one request passes through (Explorative Study, §II).
What the client calls: ``routers.make_router`` picks a mode (min_latency, max_throughput, the
NSGA-II tradeoff) over a ``swarm_view.SwarmView``."""
