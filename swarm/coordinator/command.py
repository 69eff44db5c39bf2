"""`hexswarm coordinator`: run a coordinator candidate for one model (also `run-peer --coordinator`).

Several candidates may run at once: one holds the lease and plans, the others stand by and
take over within lease-ttl + 2 x period seconds of the holder vanishing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from routing.scheduler.model_spec import OBJECTIVES

logger = logging.getLogger(__name__)


def add_coordination_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `hexswarm coordinator` and `run-peer --coordinator`."""
    g = parser.add_argument_group("coordinator")
    g.add_argument(
        "--coordinator-key",
        nargs="+",
        default=None,
        metavar="PEER_ID",
        help="coordinator keys (peer ids) whose lease and plans count; default: any in a private swarm, "
        "none in the public one",
    )
    g.add_argument(
        "--lease-ttl", type=float, default=30.0, help="seconds a lease lives unrenewed (default 30)"
    )
    g.add_argument("--coordinator-period", type=float, default=5.0, help="seconds between steps (default 5)")
    g.add_argument(
        "--debounce", type=float, default=5.0, help="quiet seconds after a join/leave before re-planning"
    )
    g.add_argument("--replan-period", type=float, default=300.0, help="seconds between periodic re-plans")
    g.add_argument("--budget-s", type=float, default=5.0, help="search time budget per re-plan (seconds)")
    g.add_argument("--rate", type=float, default=1.0, help="requests per second to plan for")
    g.add_argument("--s-in", type=int, default=128, help="mean prompt tokens to plan for")
    g.add_argument("--s-out", type=int, default=32, help="generated tokens per request to plan for")
    g.add_argument(
        "--slo-scale",
        type=float,
        default=5.0,
        help="deadline in units of the swarm's own latency: one request through the whole model on its fastest "
        "peer alone, from the peers' measured speeds (default 5)",
    )
    g.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="slo",
        help="slo (default): most requests within the deadline at --rate; throughput: most tokens/s, no deadline",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--initial-peers", nargs="+", help="multiaddrs of swarm members")
    where.add_argument("--public", action="store_true", help="join the public swarm")
    parser.add_argument(
        "--model",
        required=True,
        help="a built-in model name (hexswarm models), a GGUF file or a checkpoint directory",
    )
    parser.add_argument("--identity", default=None, help="identity key file (created if missing)")
    parser.add_argument(
        "--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/0"], help="multiaddrs to listen on"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    add_coordination_arguments(parser)


def coordinator_config(args: argparse.Namespace, model_dir: str):
    """A CoordinatorConfig from the flags of `add_coordination_arguments`."""
    from routing.scheduler.genetic import SearchConfig
    from routing.scheduler.model_spec import Workload
    from swarm.coordinator.plan_command import load_model
    from swarm.coordinator.records import trust_from
    from swarm.coordinator.service import CoordinatorConfig
    from swarm.coordinator.triggers import ReplanPolicy
    from swarm.model_spec import load_model_spec

    return CoordinatorConfig(
        model_id=load_model_spec(model_dir).model_id,
        model=load_model(model_dir),
        workload=Workload(
            rate=args.rate,
            s_in=args.s_in,
            s_out=args.s_out,
            slo_scale=args.slo_scale,
            objective=args.objective,
        ),
        search=SearchConfig(time_budget_s=args.budget_s, stall_generations=30, capacity=False),
        policy=ReplanPolicy(
            debounce_s=args.debounce,
            max_delay_s=max(args.debounce, 6 * args.debounce),
            period_s=args.replan_period,
        ),
        lease_ttl=args.lease_ttl,
        period=args.coordinator_period,
        trust=trust_from(args.coordinator_key, args.public),
    )


def run(args: argparse.Namespace) -> int:
    from swarm.dht import public_initial_peers, start_dht
    from swarm.dht_process import shutdown_dht
    from swarm.identity import load_or_create_identity

    if args.verbose:  # logging itself is set up by swarm/cli.py (--quiet, --log-level)
        logging.getLogger().setLevel(logging.DEBUG)
    try:
        config = coordinator_config(args, args.model)
    except (OSError, ValueError) as e:
        print(f"hexswarm coordinator: {e}", file=sys.stderr)
        return 2
    identity = load_or_create_identity(args.identity)
    # Peers name this key with --coordinator-key to follow this coordinator's plans.
    logger.info("coordinator key: %s", identity.peer_id.to_base58())
    dht = start_dht(public_initial_peers() if args.public else args.initial_peers, identity, args.host_maddrs)
    try:
        return asyncio.run(_serve(dht, identity, config))
    finally:
        shutdown_dht(dht, 5)


async def _serve(dht, identity, config) -> int:
    from swarm.coordinator.service import Coordinator

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await Coordinator(dht, identity, config).run(stop)
    return 0
