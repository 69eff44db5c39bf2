"""`hexswarm coordinator`: run a coordinator candidate for one model (also `run-peer --coordinator`).

Several candidates may run at once: one holds the lease and plans, the others stand by and
take over within lease-ttl + 2 x period seconds of the holder vanishing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.coordinator.model_args import add_workload_arguments

logger = logging.getLogger(__name__)


def add_coordination_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `hexswarm coordinator` and `run-peer --coordinator`."""
    g = parser.add_argument_group("coordinator")
    g.add_argument(
        "--coordinator-key",
        nargs="+",
        default=None,
        metavar="PEER_ID",
        help="coordinator keys (peer ids) whose lease and plans count (default: any member of the swarm)",
    )
    g.add_argument(
        "--lease-ttl", type=cli_args.positive_float, default=30.0, help="seconds a lease lives unrenewed"
    )
    g.add_argument(
        "--coordinator-period", type=cli_args.positive_float, default=5.0, help="seconds between steps"
    )
    g.add_argument(
        "--debounce",
        type=cli_args.non_negative_float,
        default=5.0,
        help="quiet seconds after a join/leave before re-planning",
    )
    g.add_argument(
        "--replan-period",
        type=cli_args.positive_float,
        default=300.0,
        help="seconds between periodic re-plans",
    )
    g.add_argument(
        "--disaggregated",
        action="store_true",
        help="plan HexGen-2's prefill and decode replicas of the --layers auto peers too (they take "
        "their role with --role auto), kept only where they serve more tokens/s than the colocated "
        "plan on a simulated trace of the workload (each search gets --budget-s; docs/scheduling.md)",
    )
    g.add_argument(
        "--force-disaggregated",
        action="store_true",
        help="with --disaggregated: keep the disaggregated plan wherever the peers can be split so, "
        "without comparing (its gain may be latency rather than tokens/s)",
    )
    g.add_argument(
        "--budget-s",
        type=cli_args.positive_float,
        default=5.0,
        help="search time budget per re-plan (seconds)",
    )
    add_workload_arguments(g)
    g.add_argument(
        "--slo-scale",
        type=cli_args.positive_float,
        default=5.0,
        help="deadline in units of the swarm's own latency: one request through the whole model on its fastest "
        "peer alone, from the peers' measured speeds",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_initial_peers(parser)
    cli_args.add_model_argument(parser)
    parser.add_argument(
        "--identity",
        default=None,
        help="identity key file (created if missing): a stable key for the peers' --coordinator-key "
        "(default: a new key each start)",
    )
    parser.add_argument(
        "--host-maddrs",
        nargs="+",
        default=["/ip4/0.0.0.0/tcp/0"],
        metavar="MADDR",
        help="multiaddrs to listen on",
    )
    add_coordination_arguments(parser)


def coordinator_config(args: argparse.Namespace, model_dir: str):
    """A CoordinatorConfig from the flags of `add_coordination_arguments`."""
    from hexswarm.routing.scheduler.model_spec import Workload
    from hexswarm.routing.scheduler.search.genetic import SearchConfig
    from hexswarm.swarm.coordinator.model_args import load_model
    from hexswarm.swarm.coordinator.records import trust_from
    from hexswarm.swarm.coordinator.service import CoordinatorConfig
    from hexswarm.swarm.coordinator.triggers import ReplanPolicy
    from hexswarm.swarm.models.model_spec import load_model_spec

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
        trust=trust_from(args.coordinator_key),
        disaggregated=args.disaggregated or args.force_disaggregated,
        force_disaggregated=args.force_disaggregated,
    )


def run(args: argparse.Namespace) -> int:
    from hexswarm.swarm.net.dht import start_dht
    from hexswarm.swarm.net.dht_process import shutdown_dht
    from hexswarm.swarm.net.identity import load_or_create_identity

    cli_args.check_model(args.model)
    try:
        config = coordinator_config(args, args.model)
    except (OSError, ValueError) as e:  # a model that cannot be read, a bad --coordinator-key
        raise cli_args.UsageError(str(e)) from None
    identity = load_or_create_identity(args.identity)
    # Peers name this key with --coordinator-key to follow this coordinator's plans.
    logger.info("coordinator key: %s", identity.peer_id.to_base58())
    # A client of the DHT: nobody dials a coordinator (its nudges go out, swarm/coordinator/nudges.py),
    # and one run at home, behind NAT, would sit in others' routing tables where no one can
    # reach it (peer/dht_mode.py)
    dht = start_dht(args.initial_peers, identity, args.host_maddrs, client_mode=True)
    try:
        return asyncio.run(_serve(dht, identity, config))
    finally:
        shutdown_dht(dht, 5)


async def _serve(dht, identity, config) -> int:
    from hexswarm.swarm.coordinator.service import Coordinator

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await Coordinator(dht, identity, config).run(stop)
    return 0
