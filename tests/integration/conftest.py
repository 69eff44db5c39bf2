"""A real private swarm for the integration tests: bootstrap, peers and a client on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import StoppingCriteria

from hexswarm.swarm.tools.launcher import LocalSwarm, Managed

# name -> (layers, extra run-peer flags). p2 and p3 overlap on 3:6 so a chain survives either
# leaving; "guard" has tight limits for the bad-input tests.
PEERS = {
    "p1": ("0:3", ()),
    "p2": ("2:6", ()),
    "p3": ("3:6", ()),
    "guard": (
        "0:3",
        (
            "--max-sessions",
            "2",
            "--max-length",
            "32",
            "--max-frame-mb",
            "1",
            "--max-session-cache-tokens",
            "64",
        )
        + ("--handshake-timeout", "8"),
    ),
}


@dataclass
class Swarm:
    local: LocalSwarm
    model_dir: Path
    peers: dict[str, Managed]

    @property
    def initial_peers(self) -> list[str]:
        return self.local.initial_peers


@pytest.fixture(scope="session")
def shared_swarm(make_model, tmp_path_factory):
    """One swarm for the integration tests that only use it (starting one takes ~20 s on 2
    cores); `swarm` hands it out healthy."""
    model_dir = make_model(arch="llama")
    with LocalSwarm(tmp_path_factory.mktemp("swarm")) as local:
        local.start_bootstrap()
        peers = local.start_peers(model_dir, PEERS, "--announce-period", "1", timeout=180)
        yield Swarm(local, Path(model_dir), peers)


@pytest.fixture(autouse=True)
def _healthy_shared_swarm(request):
    """Before each test that uses the shared swarm: every peer runs (a test that stopped or
    killed one and failed before starting it again does not break the tests after it)."""
    if not {"swarm", "model", "shared_swarm"} & set(request.fixturenames):
        return
    swarm = request.getfixturevalue("shared_swarm")
    if not swarm.local.processes[0].alive():
        pytest.fail("the shared swarm's bootstrap is gone; the tests after this one cannot run")
    for name, proc in list(swarm.peers.items()):
        if _stopped(proc):  # SIGSTOPped by a test that did not resume it
            os.kill(proc.popen.pid, signal.SIGCONT)
        if not proc.alive():
            layers, extra = PEERS[name]
            print(f"[shared swarm] peer {name} was gone after the last test: starting it again")
            swarm.peers[name] = swarm.local.start_peer(
                swarm.model_dir, layers, name, "--announce-period", "1", *extra
            )


def _stopped(proc: Managed) -> bool:
    try:
        with open(f"/proc/{proc.popen.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.fixture
def swarm(shared_swarm) -> Swarm:
    """The shared swarm, with every peer running (see `_healthy_shared_swarm`)."""
    return shared_swarm


def peer_id_of(model, name: str) -> str:
    from hexswarm.swarm.trust.records import read_peer_records

    ids = [r.peer_id for r in read_peer_records(model.swarm.dht, model.spec.model_id) if r.name == name]
    if not ids:
        raise LookupError(f"no record for peer {name}")
    return ids[0]


@pytest.fixture(scope="session")
def model(shared_swarm):
    from hexswarm.client import DistributedModelForCausalLM

    model = DistributedModelForCausalLM.from_pretrained(
        shared_swarm.model_dir, initial_peers=shared_swarm.initial_peers, coverage_timeout=60
    )
    yield model
    model.shutdown()


@pytest.fixture(scope="session")
def local_model(shared_swarm):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(shared_swarm.model_dir)


class SignalHopPeer(StoppingCriteria):
    """A generate() stopping criterion that never stops: after `tokens` new tokens it sends `sig`
    (SIGKILL unless told) to the peer serving hop `hop` of the session's chain (its name is kept
    in `victim`); `peers` maps names to processes."""

    def __init__(self, model, peers, tokens: int, hop: int, sig: int = signal.SIGKILL):
        self.model, self.peers, self.tokens, self.hop, self.sig = model, peers, tokens, hop, sig
        self.calls, self.victim = 0, None

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        if self.calls == self.tokens:
            self.victim = self.model.session.peer_names()[self.hop]
            os.kill(self.peers[self.victim].popen.pid, self.sig)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


@contextlib.contextmanager
def swarm_of(model_dir, folder: Path, layout: dict) -> Iterator[tuple[LocalSwarm, dict[str, Managed]]]:
    """A bootstrap and the peers of `layout` (name -> (layers, own flags)), announcing every second."""
    with LocalSwarm(folder) as local:
        local.start_bootstrap()
        yield local, local.start_peers(model_dir, layout, "--announce-period", "1", timeout=240)


@contextlib.contextmanager
def client_at_home(net, local: LocalSwarm, model_dir, home: int, coverage_timeout: float):
    """A client whose DHT and p2pd live in home `home` of `net` (swarm/nat/netlab.py), behind NAT."""
    from hexswarm.client import DistributedModelForCausalLM
    from hexswarm.swarm.nat import netlab

    # torch's shared-memory manager answers on an abstract Unix socket, which a network namespace
    # scopes: start it here, or one started inside the home is lost to this process with the lab
    torch.zeros(1).share_memory_()
    with netlab.inside(net.home(home).host_ns):
        model = DistributedModelForCausalLM.from_pretrained(
            model_dir, initial_peers=local.initial_peers, coverage_timeout=coverage_timeout
        )
    try:
        yield model
    finally:
        model.shutdown()


def local_greedy(model_dir, prompt: list[list[int]], new_tokens: int) -> torch.Tensor:
    """The same model's own greedy generate() in this process: what the swarm must equal."""
    from transformers import AutoModelForCausalLM

    local_model = AutoModelForCausalLM.from_pretrained(model_dir)
    return local_model.generate(torch.tensor(prompt), max_new_tokens=new_tokens, do_sample=False)


def store_until_taken(
    dht, key: str, value: bytes, subkey: bytes, lifetime: float = 60, timeout: float = 30
) -> None:
    """Stores `value` until a DHT node takes it: a store fails when no node answered in time,
    and a node that has just joined, on a loaded machine, may not reach one yet."""
    from hivemind.utils import get_dht_time

    from tests.integration.test_coordinator import wait_until

    what = f"a DHT node taking the value under {key}"
    wait_until(lambda: dht.store(key, value, get_dht_time() + lifetime, subkey=subkey), timeout, what)
