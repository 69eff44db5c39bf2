"""Starting hivemind DHT nodes the way every hexswarm role needs them."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if (
    TYPE_CHECKING
):  # hivemind loads when a node starts: `--help` of the commands that join does not wait for it
    from hexswarm.swarm.identity import Identity

# The public swarm's bootstrap nodes, overridable with HEXSWARM_INITIAL_PEERS (space- or
# comma-separated multiaddrs). Empty until a public swarm runs: the commands offer no `--public`
# yet, and `from_pretrained(public=True)` says so clearly.
PUBLIC_INITIAL_PEERS: tuple[str, ...] = ()
INITIAL_PEERS_ENV = "HEXSWARM_INITIAL_PEERS"

DEFAULT_HOST_MADDRS = ("/ip4/0.0.0.0/tcp/0",)


def public_initial_peers() -> list[str]:
    from_env = os.environ.get(INITIAL_PEERS_ENV, "")
    peers = [p for p in from_env.replace(",", " ").split() if p] or list(PUBLIC_INITIAL_PEERS)
    if not peers:
        raise SystemExit(
            f"no public bootstrap peers are configured; set {INITIAL_PEERS_ENV} or pass --initial-peers"
        )
    return peers


def start_dht(
    initial_peers: Sequence[str],
    identity: Identity | None,
    host_maddrs: Sequence[str] = DEFAULT_HOST_MADDRS,
    announce_maddrs: Sequence[str] = (),
    client_mode: bool = False,
    wait_timeout: float = 30,
    listen: bool = True,
):
    """A running hivemind DHT node that signs with `identity` and validates every record it sees.

    Every role installs the signature validator: nodes without it would store forged records.
    The node's process (and its p2pd) exits when this process dies (swarm/dht_process.py);
    stop it with `swarm.dht_process.shutdown_dht`, which is bounded in time.
    """
    from hivemind.dht.crypto import RSASignatureValidator

    from hexswarm.swarm.dht_process import OwnedDHT

    validator = RSASignatureValidator(identity.private_key if identity else None)
    kwargs = dict(
        initial_peers=list(initial_peers),
        host_maddrs=list(host_maddrs),
        client_mode=client_mode,
        record_validators=[validator],
        start=True,
        await_ready=True,
        wait_timeout=wait_timeout,
    )
    if announce_maddrs:
        kwargs["announce_maddrs"] = list(announce_maddrs)
    if not listen:  # a client that only dials out: no open port, and no NAT port mapping asked for
        kwargs.update(no_listen=True, nat_port_map=False, host_maddrs=[])
    if identity is not None:
        kwargs["identity_path"] = str(identity.identity_path)
    with _children_ignore_ctrl_c():
        return OwnedDHT(**kwargs)


@contextlib.contextmanager
def _children_ignore_ctrl_c():
    """Ctrl-C in a terminal reaches the whole process group. The DHT child process and its
    p2pd inherit "ignore SIGINT" from here, so they stay up while the parent announces that
    it is leaving, and the parent shuts them down itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
