"""Chaos for failover tests and benchmarks: hurt peers of a local swarm mid-generation, then heal them.

`ChaosSwarm` owns redundant peers (started with the hidden `--debug-fault-on-signal` flag,
peer.faults) and hurts one on request:

- "kill":  SIGKILL its main process (a crash; its DHT child and p2p daemon are left over,
           so healing kills the whole process group, checks that it is gone, and restarts it);
- "stop":  SIGSTOP (a stall: it keeps its connections but never answers); healed by SIGCONT;
- "error": SIGUSR1 (every later step answers a typed INTERNAL error, or NaN with
           `--debug-fault nan`); healed by SIGUSR2.

`ChaosMonkey` is a generation stopping criterion (it never stops anything): seeded, it
picks the tokens after which to hurt a peer of the chain in use, and records when each
token came, so a run can tell how long recovery took (fault -> next token).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import StoppingCriteria

from hexswarm.swarm.tools.launcher import LaunchError, LocalSwarm, Managed

ACTIONS = ("kill", "stop", "error")
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "error": signal.SIGUSR1}


@dataclass
class Fault:
    peer: str
    action: str
    after_token: int  # tokens generated when it was injected
    at: float  # time.monotonic()
    recovery_s: float | None = None  # to the next token


@dataclass
class ChaosSwarm:
    """Peers of one model on a LocalSwarm (bootstrap already started), each hurtable by name."""

    local: LocalSwarm
    model_dir: Path
    layout: dict[str, tuple[str, tuple[str, ...]]]  # name -> (layers, extra run-peer flags)
    peers: dict[str, Managed] = field(default_factory=dict)
    hurt: dict[str, str] = field(default_factory=dict)  # name -> action, until healed

    def start(self, names: list[str] | None = None, wait: bool = True, timeout: float = 180) -> None:
        names = list(self.layout) if names is None else names
        for name in names:
            layers, extra = self.layout[name]
            flags = ("--announce-period", "1", "--debug-fault-on-signal", *extra)
            self.peers[name] = self.local.start_peer(self.model_dir, layers, name, *flags, wait=False)
        if wait:
            self.settle(0, timeout)

    def starting(self) -> list[str]:
        """Peers not online yet."""
        return [name for name, proc in self.peers.items() if "online:" not in proc.log()]

    def settle(self, max_starting: int = 1, timeout: float = 180) -> None:
        """Waits until at most `max_starting` peers are still starting (restarts run in the background)."""
        deadline = time.monotonic() + timeout
        while len(self.starting()) > max_starting:
            for name in self.starting():
                if not self.peers[name].alive():
                    raise LaunchError(f"peer {name} exited:\n{self.peers[name].log()[-3000:]}")
            if time.monotonic() > deadline:
                raise LaunchError(f"peers {self.starting()} did not come online within {timeout} s")
            time.sleep(0.2)

    def inject(self, name: str, action: str) -> None:
        os.kill(self.peers[name].popen.pid, SIGNALS[action])
        self.hurt[name] = action

    def heal(self) -> None:
        """Makes every hurt peer healthy again; a killed one is restarted after its group is gone."""
        killed = []
        for name, action in self.hurt.items():
            proc = self.peers[name]
            if action == "kill":
                _kill_and_reap(proc)
                killed.append(name)
            else:
                os.kill(proc.popen.pid, signal.SIGCONT if action == "stop" else signal.SIGUSR2)
        self.hurt.clear()
        if killed:
            self.start(killed, wait=False)  # they come online while later runs route around them

    def leftovers(self) -> list[int]:
        """Processes still alive in the groups of peers that are gone (should be none)."""
        return [pid for p in self.local.processes if not p.alive() for pid in group_members(p.popen.pid)]


def _kill_and_reap(proc: Managed, timeout: float = 10) -> None:
    try:
        os.killpg(proc.popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.popen.wait(timeout)
    deadline = time.monotonic() + timeout
    while group_members(proc.popen.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _proc_stats() -> list[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgrp) of every process, read from /proc."""
    stats = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]  # the fields after "pid (comm)"
        stats.append((int(entry), state, int(ppid), int(pgrp)))
    return stats


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    return [pid for pid, state, _, pgrp in _proc_stats() if pgrp == pgid and state != "Z"]


# Helpers that torch starts in the process that uses it and that end with it: not ours to stop.
_OWN_HELPERS = ("torch_shm_manager",)


def child_processes(pid: int | None = None) -> list[int]:
    """Live children of `pid` (default: this process), torch's own helpers left out."""
    pid = os.getpid() if pid is None else pid
    children = [p for p, state, ppid, _ in _proc_stats() if ppid == pid and state != "Z"]
    return [p for p in children if not _cmdline(p).startswith(_OWN_HELPERS)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


class ChaosMonkey(StoppingCriteria):
    """Hurts a random peer of the chain after some tokens; times every token. Never stops generation."""

    def __init__(
        self,
        chaos: ChaosSwarm,
        chain: Callable[[], list[str]],
        rng: random.Random,
        new_tokens: int,
        faults: int = 1,
        actions: tuple[str, ...] = ACTIONS,
    ):
        self.chaos, self.chain, self.rng, self.actions = chaos, chain, rng, actions
        # Calls happen after each new token; hurt after token k for k in the plan (1..new_tokens-1).
        self.plan = sorted(rng.sample(range(1, new_tokens), min(faults, new_tokens - 1)))
        self.faults: list[Fault] = []
        self.token_times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        now = time.monotonic()
        self.token_times.append(now)
        for fault in self.faults:
            if fault.recovery_s is None:
                fault.recovery_s = now - fault.at
        if len(self.token_times) in self.plan:
            candidates = [n for n in self.chain() if n in self.chaos.peers and n not in self.chaos.hurt]
            if candidates:
                name, action = self.rng.choice(candidates), self.rng.choice(self.actions)
                self.chaos.inject(name, action)
                self.faults.append(Fault(name, action, len(self.token_times), time.monotonic()))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


# Redundant peers of a 6-block model: any two may be hurt at once and every block stays served.
# "e" serves everything (routers like it: one hop) and answers NaN, not an error, when hurt.
LAYOUT: dict[str, tuple[str, tuple[str, ...]]] = {
    "a": ("0:4", ()),
    "b": ("0:3", ()),
    "c": ("2:6", ()),
    "d": ("3:6", ()),
    "e": ("0:6", ("--debug-fault", "nan")),
}


@dataclass
class RunResult:
    seed: int
    exact: bool  # output equals the local model's (= the no-failure output)
    faults: list[Fault]
    retries: int  # failed attempts the client absorbed
    route: str  # the chain at the end


def chaos_run(
    model, local_model, chaos: ChaosSwarm, seed: int, new_tokens: int = 12, faults: int = 1
) -> RunResult:
    """One seeded greedy generation on `model` (a DistributedModelForCausalLM) with `faults` peers
    of its chain hurt along the way; heals them afterwards."""
    from transformers import StoppingCriteriaList

    rng = random.Random(seed)
    prompt = torch.randint(3, 400, (1, rng.randint(3, 9)), generator=torch.Generator().manual_seed(seed))
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    expected = local_model.generate(prompt, **kwargs)

    def chain() -> list[str]:
        return model.session.peer_names() if model.session is not None else []

    monkey = ChaosMonkey(chaos, chain, rng, new_tokens, faults)
    try:
        got = model.generate(prompt, stopping_criteria=StoppingCriteriaList([monkey]), **kwargs)
    finally:
        chaos.heal()
    failovers = model.last_failovers
    return RunResult(
        seed=seed,
        exact=bool(torch.equal(got, expected)),
        faults=monkey.faults,
        retries=failovers[-1].attempts if failovers else 0,
        route=model.last_route or "",
    )
