"""A public swarm outlives its bootstraps: homes behind NAT in network namespaces.

Two bootstraps on the "internet" (each relays and dials back), two peers at home behind NAT
serving halves of the model, and a client in a third home (swarm/nat/netlab.py draws it). No
node of the swarm is restarted but the bootstraps. The tests run in file order on one lab and
build on each other: one bootstrap stops mid-generation (Ctrl-C); then the other stops too and
the first comes back; then a peer dies with no replacement.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from hexswarm.swarm.nat import netlab
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records
from tests.integration.conftest import client_at_home, local_greedy

pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.slow]

WHY_NOT = netlab.available()
if WHY_NOT:
    pytest.skip(f"NAT tests need network namespaces: {WHY_NOT}", allow_module_level=True)

ANY = "/ip4/0.0.0.0/tcp/0"
PORTS = {"boot-a": 31401, "boot-b": 31402}  # fixed, as an operator's: a restart keeps the address
PROMPT = [[1, 5, 9, 14, 3, 7]]
NEW_TOKENS = 16
HEAL_BOUND_S = 60  # both bootstraps down, one back: the swarm serves again within this
DEAD_SPAN_BOUND_S = 5  # a span's only peer killed: the client says so within this


class Lab:
    def __init__(self, net: netlab.NetLab, local: LocalSwarm, model_dir):
        self.net, self.local, self.model_dir = net, local, model_dir
        self.peers, self.boots, self.addrs = {}, {}, {}

    def start_bootstrap(self, name: str) -> None:
        known = list(self.local.initial_peers)
        self.local.initial_peers = []
        [addr] = self.local.start_bootstrap(
            60,
            name=name,
            launcher=self.net.exec_prefix(self.net.public_ns),
            host_maddrs=f"/ip4/0.0.0.0/tcp/{PORTS[name]}",
            address_prefix=f"/ip4/{netlab.PUBLIC_HOST_IP}/",
        )
        self.boots[name] = self.local.processes[-1]
        self.addrs[name] = addr
        self.local.initial_peers = list(dict.fromkeys([*known, addr]))

    def boot_id(self, name: str) -> str:
        return self.addrs[name].rsplit("/p2p/", 1)[1]

    def start_peer(self, name: str, layers: str, home: int):
        self.peers[name] = self.local.start_peer(
            self.model_dir,
            layers,
            name,
            "--host-maddrs",
            ANY,
            "--announce-period",
            "2",
            wait=False,
            launcher=self.net.exec_prefix(self.net.home(home).host_ns),
        )

    def status(self, via: str) -> subprocess.CompletedProcess:
        """`hexswarm status` from home 3 (behind NAT, like the client), through one bootstrap."""
        command = [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "status",
            "--initial-peers",
            self.addrs[via],
        ]
        return subprocess.run(
            [*self.net.exec_prefix(self.net.home(3).host_ns), *command],
            capture_output=True,
            text=True,
            timeout=90,
        )


@pytest.fixture(scope="module")
def lab(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama")
    with netlab.NetLab(homes=3) as net, LocalSwarm(tmp_path_factory.mktemp("outage")) as local:
        lab = Lab(net, local, model_dir)
        lab.start_bootstrap("boot-a")
        lab.start_bootstrap("boot-b")
        lab.start_peer("home1", "0:3", 1)
        lab.start_peer("home2", "3:6", 2)
        for proc in lab.peers.values():
            local.wait_for_log(proc, "online:", 120)
        yield lab


@pytest.fixture(scope="module")
def client(lab):
    with client_at_home(lab.net, lab.local, lab.model_dir, 3, coverage_timeout=HEAL_BOUND_S) as model:
        yield model


@pytest.fixture(scope="module")
def expected(lab):
    return local_greedy(lab.model_dir, PROMPT, NEW_TOKENS)


class AtToken(StoppingCriteria):
    """Never stops the generation; calls `action` once, when `tokens` new tokens are out."""

    def __init__(self, tokens: int, action):
        self.tokens, self.action, self.at = tokens, action, None

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        if self.at is None and input_ids.shape[1] - len(PROMPT[0]) >= self.tokens:
            self.at = time.monotonic()
            self.action()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def generate(client, *criteria):
    return client.generate(
        torch.tensor(PROMPT),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        stopping_criteria=StoppingCriteriaList(criteria),
    )


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(1)
    pytest.fail(f"{what} did not happen within {timeout} s")


def test_a_bootstrap_stopped_mid_generation_loses_nothing_and_status_stays_true(lab, client, expected):
    boot_a = lab.boots["boot-a"]
    ctrl_c = AtToken(4, lambda: os.killpg(boot_a.popen.pid, signal.SIGINT))  # a terminal's Ctrl-C
    assert torch.equal(generate(client, ctrl_c), expected)
    assert boot_a.popen.wait(timeout=30) == 0, boot_a.log()[-2000:]
    assert "Traceback" not in boot_a.log() and "stopped" in boot_a.log(), boot_a.log()[-3000:]

    gone = lab.boot_id("boot-a")

    def records_without_the_gone_relay():
        records = {r.name: r for r in read_peer_records(client.swarm.dht, client.spec.model_id)}
        homes = [records.get(name) for name in ("home1", "home2")]
        return all(r and r.relays and gone not in r.relays for r in homes)

    wait_for(records_without_the_gone_relay, 30, "both homes' records dropping the stopped relay")
    status = lab.status(via="boot-b")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "NO ANSWER" not in status.stdout and "ONE PEER ONLY: blocks 0:6" in status.stdout, (
        status.stdout + status.stderr[-2000:] + "".join(p.log()[-1500:] for p in lab.peers.values())
    )
    assert torch.equal(generate(client), expected)


def test_with_both_bootstraps_down_one_coming_back_heals_the_swarm(lab, client, expected):
    lab.local.stop(lab.boots["boot-b"], timeout=10)
    time.sleep(3)  # the swarm without any bootstrap: peers lose their relays and their DHT
    lab.start_bootstrap("boot-a")  # same identity, same address
    began = time.monotonic()
    status = wait_for(
        lambda: (s := lab.status(via="boot-a")).returncode == 0 and s,
        HEAL_BOUND_S,
        "status via boot-a exiting 0",
    )
    print(f"status exited 0 {time.monotonic() - began:.1f} s after boot-a came back:\n{status.stdout}")
    assert torch.equal(generate(client), expected)
    healed = time.monotonic() - began
    print(f"the old client generated again {healed:.1f} s after boot-a came back")
    assert healed < HEAL_BOUND_S
    assert all(proc.alive() for proc in lab.peers.values()), "no peer was restarted (or died)"
    for proc in lab.peers.values():
        assert "re-joining through" in proc.log() or "back in touch with" in proc.log(), proc.log()[-3000:]


def test_a_span_whose_only_peer_dies_is_told_within_seconds_with_the_output_so_far(lab, client, expected):
    from hexswarm.client import SpanUnservedError

    victim = lab.peers["home2"]
    kill = AtToken(4, lambda: os.killpg(victim.popen.pid, signal.SIGKILL))
    with pytest.raises(SpanUnservedError) as info:
        generate(client, kill)
    told = time.monotonic() - kill.at
    print(f"told {told:.1f} s after the kill: {info.value}")
    assert told < DEAD_SPAN_BOUND_S, told
    assert "no peer serves blocks 3:6" in str(info.value), str(info.value)
    partial = info.value.partial_output
    assert partial is not None and partial.shape[1] >= len(PROMPT[0]) + 4, partial
    assert torch.equal(partial, expected[:, : partial.shape[1]])
