"""The DHT child process of every hexswarm role, made to die with the process that owns it.

hivemind.DHT is a forked child process that runs the DHT node and itself spawns the p2p
daemon (p2pd). Left alone, both outlive their owner when it dies without a clean shutdown
(SIGKILL, the OOM killer, a crash): `daemon=True` only helps on a normal interpreter exit.
Worse, the child inherits its owner's signal setup at fork time: asyncio's signal handlers
in a peer turn SIGTERM into a write to the *owner's* wakeup socket, so the orphan ignores
SIGTERM too.

`OwnedDHT` subclasses hivemind.DHT and overrides only `run()` (the documented
multiprocessing.Process hook that runs in the child) to, before hivemind's own `run()`:

- reset the inherited signal setup: SIGTERM stops the child's p2pd and exits;
- start a watchdog thread that polls the parent pid and, once the owner is gone (the child
  is re-parented), stops p2pd and exits;
- exit only between two results sent to the owner (`_ExitBetweenSends`). hivemind's futures
  send every result through one pipe guarded by a lock that all DHT children of one owner
  share (`MPFuture._update_lock`, a semaphore): a child that exits while holding it leaves it
  held for good, and every later DHT node of that owner waits forever to say it is ready.

A polled watchdog rather than PR_SET_PDEATHSIG: the death signal fires when the *thread*
that forked the child exits, and clients start their DHT from whichever thread first needs
it, so it could kill a healthy child. p2pd is started by hivemind without a hook of ours, so
the DHT child stops it from the outside (its children are found in /proc).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from hivemind.dht import DHT
from hivemind.utils.mpfuture import MPFuture

logger = logging.getLogger(__name__)

WATCHDOG_PERIOD_S = 0.5  # how often the child checks that its owner is alive
CHILD_GRACE_S = 1.0  # p2pd gets this long after SIGTERM before SIGKILL
SEND_WAIT_S = 5.0  # an exit waits this long for a result being sent to the owner


class _DaemonClosingNoise(logging.Filter):
    """Drops p2pd's "error accepting connection: ... use of closed network connection": its
    accept loop says it at ERROR when p2pd closes its own control socket on a clean stop."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("error accepting connection" in message and "use of closed network connection" in message)


# hivemind relays p2pd's log lines through this logger, in whichever process owns the daemon
# (the forked DHT child inherits the filter)
logging.getLogger("hivemind.p2p.p2p_daemon").addFilter(_DaemonClosingNoise())


class OwnedDHT(DHT):
    """A hivemind DHT whose process (and its p2pd) exits when its owner process dies.

    A client-mode node never keeps what it stores: hivemind would keep a copy in its own storage
    when it counts itself among the nodes nearest the key, and no other node stores there, so
    that copy holds only this node's own entries: a subset that a read may keep, since a read
    keeps whichever copy it finds that expires last (swarm/net/dht_read.py), and right after a
    store this one does."""

    def __init__(self, *args, client_mode: bool = False, **kwargs):
        self._owner_pid = os.getpid()  # before super().__init__, which may start the child
        self.stores_locally = not client_mode
        super().__init__(*args, client_mode=client_mode, **kwargs)

    def store(self, *args, **kwargs):
        if not self.stores_locally:
            kwargs.setdefault("exclude_self", True)
        return super().store(*args, **kwargs)

    def run(self) -> None:  # runs in the child process
        gate = _ExitBetweenSends()
        gate.install()
        signal.signal(signal.SIGTERM, lambda *_: gate.exit())
        try:
            signal.set_wakeup_fd(-1)  # the inherited one belongs to the owner's event loop
        except ValueError:
            pass
        threading.Thread(
            target=_watch_owner, args=(self._owner_pid, gate), name="owner-watchdog", daemon=True
        ).start()
        super().run()


class _ExitBetweenSends:
    """Exits the child only while it holds no part of a result sent to the owner.

    A send holds `_lock` throughout (hivemind's lock serializes sends anyway). An exit asked
    from another thread waits for it; one asked by the SIGTERM handler, which runs on the main
    thread and may interrupt that thread's own send, exits at once unless that send already
    holds hivemind's lock, and is then carried out by the send once it is done.
    """

    def __init__(self):
        self._lock = threading.RLock()
        self._exit_asked = False

    def install(self) -> None:
        send = MPFuture._send_update

        def send_whole(future, *args, **kwargs):
            with self._lock:
                send(future, *args, **kwargs)
                if self._exit_asked:
                    _exit_with_children()

        MPFuture._send_update = send_whole

    def exit(self) -> None:
        # a send stuck for good (the owner no longer reads) must not keep the child alive
        locked = self._lock.acquire(timeout=SEND_WAIT_S)
        self._exit_asked = True
        if not _holds_update_lock():
            _exit_with_children()
        if locked:
            self._lock.release()


def _holds_update_lock() -> bool:
    # multiprocessing counts a lock's acquisitions per process (reset in a forked child)
    return MPFuture._update_lock._semlock._count() > 0


def _watch_owner(owner_pid: int, gate: _ExitBetweenSends) -> None:
    while os.getppid() == owner_pid:
        time.sleep(WATCHDOG_PERIOD_S)
    gate.exit()


def _exit_with_children(*_signal_args) -> None:
    stop_children(os.getpid(), CHILD_GRACE_S)
    os._exit(0)


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; empty elsewhere)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may contain spaces, so split after its last ')'
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def stop_children(pid: int, grace: float) -> None:
    """SIGTERM to the children of `pid`, SIGKILL to those still there after `grace` seconds."""
    children = child_pids(pid)
    for child in children:
        _signal(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while children and time.monotonic() < deadline:
        children = [c for c in children if _reap_or_alive(c)]
        time.sleep(0.05)
    for child in children:
        _signal(child, signal.SIGKILL)
        _reap_or_alive(child)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_or_alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours to reap (or already reaped)
        return Path(f"/proc/{pid}").exists()
    return done == 0


def shutdown_dht(dht, timeout: float) -> None:
    """hivemind's clean shutdown, bounded: after `timeout` seconds in all, the child is
    terminated (its SIGTERM handler stops p2pd), then killed."""
    deadline = time.monotonic() + timeout
    dht.shutdown_timeout = max(0.1, timeout - CHILD_GRACE_S - 0.5)  # hivemind terminates after it
    try:
        dht.shutdown()
    except (OSError, ValueError) as e:  # the pipe to a dead child
        logger.debug("DHT shutdown: %s", e)
    dht.join(max(0.0, deadline - time.monotonic()))
    if dht.is_alive():
        logger.warning("the DHT process did not stop within %.1f s; killing it", timeout)
        dht.kill()
        dht.join(1.0)
