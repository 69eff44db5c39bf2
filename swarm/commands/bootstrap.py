"""`hexswarm bootstrap`: a DHT node with a stable address that a swarm joins through.

Besides the DHT it serves what peers need from a reachable node: circuit relay v2 for peers
behind NAT (on by default, with limits that fit hidden-state traffic), dial-backs that tell a
peer whether others can reach it (swarm/nat/reachability/), and the announce relay for edge
peers (swarm/nat/announce_relay.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading
from functools import partial

from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.commands.cli_args import add_relay_limits, relay_limits

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host-maddrs",
        nargs="+",
        default=["/ip4/0.0.0.0/tcp/0"],
        metavar="MADDR",
        help="multiaddrs to listen on, e.g. /ip4/0.0.0.0/tcp/31337 (a fixed port keeps the address you hand out valid)",
    )
    parser.add_argument(
        "--announce-maddrs", nargs="+", default=[], metavar="MADDR", help="public multiaddrs to tell others"
    )
    parser.add_argument(
        "--identity",
        default=None,
        help="identity key file (created if missing); keeps the peer id stable across restarts "
        "(default: a new peer id each start)",
    )
    parser.set_defaults(empty_public_list_ok=True)  # the first node of a public swarm has none to join
    cli_args.add_initial_peers(parser, required=False)
    parser.add_argument(
        "--no-relay",
        action="store_true",
        help="do not relay for peers behind NAT (they then need another reachable node to relay them)",
    )
    add_relay_limits(parser)


def run(args: argparse.Namespace) -> int:
    from hexswarm.swarm.net.dht import INITIAL_PEERS_ENV, start_dht
    from hexswarm.swarm.net.dht_process import shutdown_dht
    from hexswarm.swarm.net.identity import load_or_create_identity

    identity = load_or_create_identity(args.identity)
    dht = start_dht(
        args.initial_peers, identity, host_maddrs=args.host_maddrs, announce_maddrs=args.announce_maddrs
    )
    for maddr in dht.get_visible_maddrs():
        print(maddr, flush=True)
    services = serve_in_thread(dht, identity, None if args.no_relay else relay_limits(args))
    relaying = "no relaying" if args.no_relay else f"relaying for peers behind NAT ({relay_limits(args)})"
    logger.info("bootstrap node %s is up, %s; Ctrl-C stops it", identity.peer_id, relaying)
    if args.public and not args.initial_peers:
        logger.info(
            "the first node of a public swarm: others join it with %s set to an address above",
            INITIAL_PEERS_ENV,
        )

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    services.set()
    shutdown_dht(dht, 5)
    return 0


def serve_in_thread(dht, identity, limits) -> threading.Event:
    """Serves the announce relay, dial-backs and (with `limits`) relay slots on `dht`'s p2p
    daemon from a thread of its own; set the event to stop."""
    stop = threading.Event()
    threading.Thread(
        target=asyncio.run,
        args=(_serve(dht, identity, limits, stop),),
        name="bootstrap-services",
        daemon=True,
    ).start()
    return stop


async def _serve(dht, identity, limits, stop: threading.Event) -> None:
    from hexswarm.swarm.nat.announce_relay import AnnounceRelay
    from hexswarm.swarm.nat.reachability.service import ip_group_of, serve_helpers
    from hexswarm.swarm.trust.dht_signing import ANNOUNCE_PROTOCOL

    p2p = await dht.replicate_p2p()
    relay = AnnounceRelay(dht, identity, partial(ip_group_of, p2p))
    await p2p.add_binary_stream_handler(ANNOUNCE_PROTOCOL, relay.handle_stream)
    relay = await serve_helpers(p2p, limits)
    logger.info("serving edge peers' announcements, dial-backs%s", " and relay slots" if relay else "")
    while not stop.is_set():
        await asyncio.sleep(0.2)
    if relay is not None:
        relay.close()
