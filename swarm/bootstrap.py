"""`hexswarm bootstrap`: a DHT node with a stable address that a private swarm joins through."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

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
    parser.add_argument(
        "--initial-peers", nargs="*", default=[], metavar="MADDR", help="other bootstrap nodes to join"
    )


def run(args: argparse.Namespace) -> int:
    from hexswarm.swarm.announce_relay import serve_in_thread
    from hexswarm.swarm.dht import start_dht
    from hexswarm.swarm.dht_process import shutdown_dht
    from hexswarm.swarm.identity import load_or_create_identity

    identity = load_or_create_identity(args.identity)
    dht = start_dht(
        args.initial_peers, identity, host_maddrs=args.host_maddrs, announce_maddrs=args.announce_maddrs
    )
    for maddr in dht.get_visible_maddrs():
        print(maddr, flush=True)
    relay = serve_in_thread(dht, identity)  # edge peers announce through it (swarm/announce_relay.py)
    logger.info("bootstrap node %s is up; Ctrl-C stops it", identity.peer_id)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    relay.set()
    shutdown_dht(dht, 5)
    return 0
