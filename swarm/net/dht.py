"""Starting hivemind DHT nodes the way every hexswarm role needs them."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hexswarm.swarm.net.maddrs import initial_peer_problem

logger = logging.getLogger(__name__)

if (
    TYPE_CHECKING
):  # hivemind loads when a node starts: `--help` of the commands that join does not wait for it
    from hexswarm.swarm.net.dht_process import OwnedDHT
    from hexswarm.swarm.net.identity import Identity

# The public swarm's bootstrap nodes ship as data (swarm/net/public_peers.txt), overridable with
# HEXSWARM_INITIAL_PEERS (space- or comma-separated multiaddrs).
PUBLIC_PEERS_FILE = Path(__file__).with_name("public_peers.txt")
INITIAL_PEERS_ENV = "HEXSWARM_INITIAL_PEERS"
NO_PUBLIC_PEERS = (
    "no public bootstrap peers are known (the list shipped with hexswarm is empty and "
    f"{INITIAL_PEERS_ENV} is unset): start one with `hexswarm bootstrap --public` and set "
    f"{INITIAL_PEERS_ENV} to the address it prints, or join a private swarm with --initial-peers"
)

DEFAULT_HOST_MADDRS = ("/ip4/0.0.0.0/tcp/0",)
# p2pd's own start is bounded at 15 s by hivemind and each first request by `wait_timeout`;
# past this, the node's process is stuck (hivemind itself would wait for it forever)
START_TIMEOUT_S = 60.0
CHILD_CHECK_S = 0.5  # how often a start checks that the node's process still runs


def public_initial_peers() -> list[str]:
    """The public swarm's bootstrap addresses: HEXSWARM_INITIAL_PEERS, else the shipped list
    (possibly empty: the caller says what to do then)."""
    from_env = os.environ.get(INITIAL_PEERS_ENV, "")
    peers = [p for p in from_env.replace(",", " ").split() if p]
    return peers or [line for kind, line in _public_list() if kind == "peer"]


def public_coordinator_keys() -> list[str]:
    """Coordinator keys the shipped list names: the only plans --public peers follow."""
    return [line for kind, line in _public_list() if kind == "coordinator"]


def _public_list() -> list[tuple[str, str]]:
    entries = []
    for line in PUBLIC_PEERS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            kind, _, rest = line.partition(" ")
            entries.append(("coordinator", rest.strip()) if kind == "coordinator" else ("peer", line))
    return entries


class InitialPeersError(RuntimeError):
    """The swarm cannot be joined through the initial peers given: one is malformed, or none of
    them answered. Commands print it as one line and exit 2; the Python client raises it."""


class DHTStartError(InitialPeersError):
    """The DHT node's process did not say it was ready in time (it is stopped then)."""


class DHTChildDied(DHTStartError):
    """The DHT node's process ended before it said it was ready."""


def check_initial_peers(initial_peers: Sequence[str]) -> None:
    """InitialPeersError for the first initial peer that is not a multiaddr with a peer id."""
    for text in initial_peers:
        problem = initial_peer_problem(text)
        if problem:
            raise InitialPeersError(problem)


def start_dht(
    initial_peers: Sequence[str],
    identity: Identity | None,
    host_maddrs: Sequence[str] = DEFAULT_HOST_MADDRS,
    announce_maddrs: Sequence[str] = (),
    client_mode: bool = False,
    wait_timeout: float = 30,
    listen: bool = True,
    await_ready: bool = True,
    start_timeout: float = START_TIMEOUT_S,
):
    """A running hivemind DHT node that signs with `identity` and validates every record it sees.

    Every role installs the signature validator: nodes without it would store forged records.
    It waits at most `start_timeout` seconds for the node to join (DHTStartError after). With
    `await_ready` False it returns as soon as the node's process is forked; the caller then
    waits with `wait_until_joined`.
    """
    from hivemind.dht.crypto import RSASignatureValidator

    validator = RSASignatureValidator(identity.private_key if identity else None)
    kwargs = dict(
        initial_peers=list(initial_peers),
        host_maddrs=list(host_maddrs),
        client_mode=client_mode,
        record_validators=[validator],
        start=True,
        await_ready=False,  # hivemind's own wait has no deadline: wait_until_joined's has one
        wait_timeout=wait_timeout,
        # No caches of found or stored values: our values are dictionaries of signed entries
        # that each writer re-stores every period, so a cached copy is a stale subset (what
        # this node stored itself, or read last), and re-storing each found value on one
        # more node (`cache_nearest`) cost a whole value per read.
        cache_locally=False,
        cache_on_store=False,
        cache_nearest=0,
    )
    if announce_maddrs:
        kwargs["announce_maddrs"] = list(announce_maddrs)
    if not listen:  # a client that only dials out: no open port, and no NAT port mapping asked for
        kwargs.update(no_listen=True, nat_port_map=False, host_maddrs=[])
    if identity is not None:
        kwargs["identity_path"] = str(identity.identity_path)
        kwargs["check_if_identity_free"] = not identity.fresh
    check_initial_peers(initial_peers)
    dht = _fork_node(kwargs)
    if not await_ready:
        return dht
    try:
        wait_until_joined(dht, initial_peers, start_timeout)
    except DHTChildDied as e:
        # hivemind forks the node's process from this one; a process whose threads already ran
        # torch can hand the child a lock held by a thread the child does not have, and the
        # child then aborts at its first torch call (std::system_error, SIGABRT: seen in a full
        # test run). A fresh fork does not inherit that moment.
        logger.warning("%s; starting it once more", e)
        dht = _fork_node(kwargs)
        wait_until_joined(dht, initial_peers, start_timeout)
    return dht


def wait_until_joined(dht, initial_peers: Sequence[str], timeout: float) -> None:
    """Waits for a node `start_dht(await_ready=False)` forked to join; InitialPeersError if
    none of `initial_peers` answered, DHTStartError if it said nothing within `timeout` seconds
    (the node is shut down then)."""
    from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError

    from hexswarm.swarm.net.dht_process import shutdown_dht

    deadline = time.monotonic() + timeout
    while True:
        try:
            dht.wait_until_ready(min(CHILD_CHECK_S, max(0.0, deadline - time.monotonic())))
            return
        except P2PDaemonError as e:
            shutdown_dht(dht, 5.0)
            raise _joining_error(e, initial_peers) from None
        except TimeoutError:
            if not dht.is_alive():  # it will never say it is ready: no need to wait the deadline out
                raise DHTChildDied(
                    f"the DHT node's process ended as it started (exit code {dht.exitcode})"
                ) from None
            if time.monotonic() >= deadline:
                shutdown_dht(dht, 5.0)
                raise DHTStartError(
                    f"the DHT node did not start within {timeout:.0f} s (its process is stopped)"
                ) from None


def _joining_error(error: Exception, initial_peers: Sequence[str]) -> Exception:
    """What p2pd's failure to start says about the initial peers, in one line (or `error`
    itself when it is about something else)."""
    text = str(error)
    if "failed to connect to bootstrap peers" in text:
        shown = ", ".join(initial_peers[:3]) + (
            f" and {len(initial_peers) - 3} more" if len(initial_peers) > 3 else ""
        )
        return InitialPeersError(
            f"none of the initial peers answered ({shown}): is that node running, can this "
            f"machine reach its address, and is the /p2p/ part its current peer id? (a node started "
            f"without --identity gets a new one each start; `hexswarm bootstrap` prints the address to give)"
        )
    if "failed to parse multiaddr" in text:
        return InitialPeersError(
            f"p2pd cannot read an initial peer: {text.split('failed to parse', 1)[1].strip()}"
        )
    return error


def _fork_node(kwargs: dict) -> OwnedDHT:
    """The node's process, forked from this one (hivemind's DHT is a ForkProcess)."""
    from hexswarm.swarm.net.dht_process import OwnedDHT

    with _children_ignore_ctrl_c(), _child_collects_none_of_ours():
        return OwnedDHT(**kwargs)


@contextlib.contextmanager
def _child_collects_none_of_ours():
    """hivemind forks the DHT node's process from this one, whose other threads (a client's, a
    peer's compute thread) hold torch objects. In the child those threads are gone, objects only
    they reached are garbage, and the child's cycle collector finalizing them aborted it (SIGABRT
    while "Garbage-collecting", twice in a row in one full test run). Frozen before the fork,
    every object the child inherits is out of its collector's reach (CPython's advice for
    fork, `gc.freeze`); the parent's are collected again once the child is started."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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
