"""Starts and stops a private swarm's processes on this machine (demo, tests, benchmarks).

Each process gets its own process group and a log file; `stop` sends SIGTERM, waits, then
kills the whole group, so no bootstrap, peer or p2p daemon outlives its `LocalSwarm`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "/ip4/127.0.0.1/tcp/0"

# Many processes share this machine's cores. OpenMP's default lets idle torch threads spin
# for a while after each op, starving the next process in the chain (measured on 2 cores:
# 78 ms per token with spinning, 2 ms passive, for the 8-layer tiny model).
COLOCATED_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# The edge peer runs from its own environment, without hivemind (scripts/env.sh makes it).
EDGE_PYTHON = Path(
    os.environ.get("HEXSWARM_EDGE_PYTHON", Path(__file__).resolve().parents[2] / ".venv-edge/bin/python")
)


class LaunchError(RuntimeError):
    pass


@dataclass
class Managed:
    """One child process and where its output goes."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class LocalSwarm:
    """A bootstrap node and peers, all on 127.0.0.1, owned by whoever made this object."""

    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: list[Managed] = field(default_factory=list)
    initial_peers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def start_bootstrap(
        self,
        timeout: float = 60,
        *extra: str,
        name: str = "bootstrap",
        launcher: tuple[str, ...] = (),
        host_maddrs: str = LOOPBACK,
        address_prefix: str = "/ip4/127.0.0.1/",
    ) -> list[str]:
        """A bootstrap node (`launcher` goes before it, e.g. `ip netns exec NS`); its address
        that starts with `address_prefix` is added to the initial peers of what starts next."""
        identity = self.workdir / f"{name}.key"
        args = [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "bootstrap",
            "--host-maddrs",
            host_maddrs,
        ]
        proc = self._spawn(
            name, [*launcher, *args, "--identity", str(identity), *extra], stdout=subprocess.PIPE
        )
        deadline = time.monotonic() + timeout
        while not (line := _read_line(proc, deadline - time.monotonic())).startswith(address_prefix):
            if not line.startswith("/"):
                raise LaunchError(
                    f"{name} did not print an address starting with {address_prefix}:\n{proc.log()}"
                )
        self.initial_peers = [*self.initial_peers, line]
        return self.initial_peers

    def start_peer(
        self,
        model_dir: str | Path,
        layers: str,
        name: str,
        *extra: str,
        wait: bool = True,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = (),
        program: tuple[str, ...] = (sys.executable, "-m", "hexswarm.peer.cli"),
    ) -> Managed:
        """A `run-peer` process (or `program`, which takes its flags); `launcher` goes before
        it, e.g. ("taskset", "-c", "0") to pin it."""
        args = [
            *launcher,
            *program,
            str(model_dir),
            "--layers",
            layers,
            "--name",
            name,
            "--initial-peers",
            *self.initial_peers,
            "--host-maddrs",
            LOOPBACK,
            *extra,
        ]
        proc = self._spawn(name, args, env=env)
        if wait:
            self.wait_for_log(proc, "online:", timeout)
        return proc

    def start_edge_peer(
        self,
        model_dir: str | Path,
        layers: str,
        name: str,
        *extra: str,
        wait: bool = True,
        timeout: float = 120,
    ) -> Managed:
        """An `edge-peer` process (py-libp2p, no hivemind) with its identity in the work folder."""
        identity = ("--identity", str(self.workdir / f"{name}.key"))
        program = (str(EDGE_PYTHON), "-m", "hexswarm.peer.edge")
        return self.start_peer(
            model_dir, layers, name, *identity, *extra, wait=wait, timeout=timeout, program=program
        )

    def start_peers(
        self,
        model_dir: str | Path,
        layout: dict[str, tuple[str, tuple[str, ...]]],
        *common: str,
        timeout: float = 120,
    ) -> dict[str, Managed]:
        """Starts every peer of `layout` (name -> (layers, its own flags)) at once, then waits for
        each to be online: on a shared machine they load in parallel."""
        peers = {
            name: self.start_peer(model_dir, layers, name, *common, *extra, wait=False)
            for name, (layers, extra) in layout.items()
        }
        for proc in peers.values():
            self.wait_for_log(proc, "online:", timeout)
        return peers

    def start_command(self, name: str, args: list[str], ready: str, timeout: float = 120) -> Managed:
        """Any other process of the swarm (an API server, a monitor), once its log says `ready`."""
        proc = self._spawn(name, args)
        self.wait_for_log(proc, ready, timeout)
        return proc

    def wait_for_log(self, proc: Managed, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in proc.log():
            if not proc.alive():
                raise LaunchError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"{proc.name} did not log {text!r} within {timeout} s:\n{proc.log()[-3000:]}"
                )
            time.sleep(0.1)

    def stop(self, proc: Managed, timeout: float = 30) -> int | None:
        """SIGTERM (a clean leave), then SIGKILL to the whole process group after `timeout`."""
        return stop_process(proc.popen, signal.SIGTERM, timeout)

    def close(self) -> None:
        for proc in reversed(self.processes):
            self.stop(proc, timeout=15)
        self.processes.clear()
        self.initial_peers = []

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self, name: str, args: list[str], stdout=None, env: dict[str, str] | None = None) -> Managed:
        log_path = self.workdir / f"{name}.log"
        log = open(log_path, "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **COLOCATED_ENV, **self.env, **(env or {})}
        popen = subprocess.Popen(
            args,
            stdout=stdout or log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=self.workdir,
        )
        log.close()
        proc = Managed(name, popen, log_path)
        self.processes.append(proc)
        return proc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_line(proc: Managed, timeout: float) -> str:
    """First stdout line of `proc`, or LaunchError after `timeout`."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(proc.popen.stdout, selectors.EVENT_READ)
    if timeout <= 0 or not selector.select(timeout):
        raise LaunchError(f"{proc.name} printed nothing within {timeout} s:\n{proc.log()}")
    return proc.popen.stdout.readline().decode().strip()


def stop_process(popen: subprocess.Popen, first_signal: int, timeout: float) -> int | None:
    """Sends `first_signal` to a process started in its own session (start_new_session=True),
    waits up to `timeout` seconds for it to exit, then SIGKILLs its whole process group, so that
    whatever it started and left behind goes too. Returns its exit status."""
    if popen.poll() is None:
        popen.send_signal(first_signal)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(popen)
    return popen.returncode


def _kill_group(popen: subprocess.Popen) -> None:
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        popen.wait(10)
    except subprocess.TimeoutExpired:
        pass
