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
    from hexswarm.swarm.net.dht import start_dht
    from hexswarm.swarm.net.dht_process import shutdown_dht
    from hexswarm.swarm.net.identity import load_or_create_identity
    from hexswarm.swarm.net.maddrs import is_loopback
    from hexswarm.swarm.tools.open_files import raise_open_files_limit

    raise_open_files_limit()  # before the DHT child and its p2pd start: they inherit it
    identity = load_or_create_identity(args.identity)
    dht = start_dht(
        args.initial_peers, identity, host_maddrs=args.host_maddrs, announce_maddrs=args.announce_maddrs
    )
    for maddr in sorted(map(str, dht.get_visible_maddrs()), key=is_loopback):  # what others can use first
        print(maddr, flush=True)
    services = Services(dht, identity, None if args.no_relay else relay_limits(args))
    relaying = "no relaying" if args.no_relay else f"relaying for peers behind NAT ({relay_limits(args)})"
    logger.info("bootstrap node %s is up, %s; Ctrl-C stops it", identity.peer_id, relaying)
    for line in advice(args):
        logger.info("%s", line)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    logger.info("stopping: relay slots and dial-backs first, then the DHT node")
    services.stop()
    shutdown_dht(dht, 5)
    logger.info("stopped")
    return 0


def advice(args: argparse.Namespace) -> list[str]:
    """What the operator of a bootstrap should know and cannot see from its addresses."""
    from hexswarm.swarm.net.dht import INITIAL_PEERS_ENV

    lines = []
    if not args.initial_peers:
        lines.append(
            "run a second bootstrap on another machine with --initial-peers set to an address above, "
            f"and give both addresses to everyone (--initial-peers, or {INITIAL_PEERS_ENV} with --public): "
            "the swarm then keeps serving while either is down, and one that restarts is found again"
        )
    if any(a.endswith("/tcp/0") for a in args.host_maddrs):
        lines.append(
            "this node listens on a new port each start: pin one (--host-maddrs /ip4/0.0.0.0/tcp/PORT) "
            "and keep --identity, so that the address you hand out stays valid across restarts"
        )
    if not args.no_relay:
        lines.append(
            "relay slots are served on ephemeral TCP ports: a firewall in front of this machine must "
            "let in the range in /proc/sys/net/ipv4/ip_local_port_range, besides the port above"
        )
    return lines


class Services:
    """The announce relay, dial-backs and relay slots, served from a thread of their own."""

    STOP_TIMEOUT_S = 5.0

    def __init__(self, dht, identity, limits):
        self.stopping = threading.Event()
        self.thread = threading.Thread(
            target=asyncio.run,
            args=(_serve(dht, identity, limits, self.stopping),),
            name="bootstrap-services",
            daemon=True,
        )
        self.thread.start()

    def stop(self) -> None:
        """Closes the relay's slots and waits for the thread, before the DHT node (and its
        daemon, which the services' streams run on) goes."""
        self.stopping.set()
        self.thread.join(self.STOP_TIMEOUT_S)


async def _serve(dht, identity, limits, stop: threading.Event) -> None:
    from hexswarm.swarm.nat.announce_relay import AnnounceRelay
    from hexswarm.swarm.nat.reachability.service import ip_group_of, serve_helpers
    from hexswarm.swarm.trust.dht_signing import ANNOUNCE_PROTOCOL

    asyncio.get_running_loop().set_exception_handler(_quiet_on_cancel)
    p2p = await dht.replicate_p2p()
    relay = AnnounceRelay(dht, identity, partial(ip_group_of, p2p))
    await p2p.add_binary_stream_handler(ANNOUNCE_PROTOCOL, relay.handle_stream)
    relay = await serve_helpers(p2p, limits)
    logger.info("serving edge peers' announcements, dial-backs%s", " and relay slots" if relay else "")
    while not stop.is_set():
        await asyncio.sleep(0.2)
    if relay is not None:
        relay.close()


def _quiet_on_cancel(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """The services' loop's error handler: a stream handler cancelled because the node stops is
    not an error (asyncio's stream server reports it as one: it reads every handler's exception)."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)
