"""The peer's services take the inputs they need, never the peer (docs/architecture.md, "The
peer's parts"): only peer/runtime.py, which builds and wires them, knows `_Peer`. Read from
the code itself (`ast`), so that no helper starts reaching into the peer again."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from hexswarm.peer.config import PeerConfig
from hexswarm.peer.core import PeerLimits
from hexswarm.peer.peer_record import RecordSource, peer_record
from hexswarm.peer.reachability import Reach
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.trust.records import PeerState

ROOT = Path(__file__).resolve().parents[2]
WIRING = ROOT / "peer" / "runtime.py"


def reaches_into_a_peer(source: str) -> list[str]:
    """Where `source` names `_Peer`, or a function reads attributes of (or keeps) a parameter
    named `peer`: each as "line: what", in line order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id == "_Peer":
            found.append((node.lineno, "names _Peer"))
        elif isinstance(node, ast.Attribute) and node.attr == "_Peer":
            found.append((node.lineno, "names _Peer"))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and _takes_peer(node):
            found += _uses_of_peer(node)
    return [f"{line}: {what}" for line, what in sorted(set(found))]


def _takes_peer(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> bool:
    args = function.args
    return any(a.arg == "peer" for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def _uses_of_peer(function: ast.AST) -> list[tuple[int, str]]:
    """`peer.attr` reads, and `x = peer` (a service keeping the peer to read it later)."""
    uses = []
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and _is_peer(node.value):
            uses.append((node.lineno, f"reads peer.{node.attr}"))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and _is_peer(node.value):
            uses.append((node.lineno, "keeps the peer"))
    return uses


def _is_peer(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Name) and node.id == "peer"


def test_the_check_finds_each_way_of_reaching_into_the_peer():
    source = (
        "def a(peer):\n    return peer.config\n"
        "class B:\n    def __init__(self, peer):\n        self.peer = peer\n"
        "def c(x: _Peer): pass\n"
        "def d(rank, peer: int):\n    send(rank, peer)\n"  # a rank named peer, only passed on
    )
    assert reaches_into_a_peer(source) == ["2: reads peer.config", "5: keeps the peer", "6: names _Peer"]


def test_no_module_of_the_peer_but_its_wiring_reaches_into_the_peer():
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in sorted((ROOT / "peer").rglob("*.py"))
        if path != WIRING
        for where in reaches_into_a_peer(path.read_text())
    ]
    assert not found, "pass a service the inputs it needs, not the peer:\n" + "\n".join(found)


def test_a_record_is_built_from_plain_values_before_the_peer_serves():
    spec = ModelSpec(Path("tiny"), "tiny-0123abcd", "llama", 8, 64, config=None)
    config = PeerConfig(
        spec, 2, 6, (), (), (), None, (torch.device("cpu"),), torch.float32, PeerLimits(), auto=True
    )
    source = RecordSource(
        config=config,
        peer_id="QmPeer",
        name="a",
        serving=None,
        reach=Reach("direct", ("/ip4/127.0.0.1/tcp/1",)),
        role="both",
        device_info=(),
        group=None,
        next_range=(4, 8),
        links=(("0123456789abcdef", 1.5),),
        plan_version=3,
        relay_slots_free=126,
    )
    record = peer_record(source, PeerState.JOINING)
    assert record.relay_slots_free == 126
    assert (record.start, record.end, record.tp, record.throughput) == (2, 6, 1, 0.0)
    assert (record.next_start, record.next_end, record.plan_version) == (4, 8, 3)
    assert (record.open_sessions, record.links, record.reachability) == (
        0,
        (("0123456789abcdef", 1.5),),
        "direct",
    )
