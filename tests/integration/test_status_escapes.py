"""`hexswarm status` prints what peers wrote about themselves without letting it drive the terminal.

A hostile peer signs, with its own real key, a model entry and a peer record whose text fields
carry ANSI escape sequences (recolour, clear the screen, retitle the window, move the cursor up
over earlier lines) and a bidirectional override; it stores them in a real DHT. `status` must
show them escaped, with no raw ESC or other control byte reaching its output.
"""

import json
import subprocess
import sys

import pytest
from hivemind.utils import get_dht_time

from hexswarm.swarm.net.dht import start_dht
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.record_keys import index_key, record_key
from hexswarm.swarm.trust.records import DeviceInfo, ModelEntry, PeerRecord
from tests.unit.record_cases import make_record

pytestmark = pytest.mark.integration

RED, CLEAR, TITLE, UP = "\x1b[31m", "\x1b[2J", "\x1b]0;pwned\x07", "\x1b[1A"
HOSTILE_MODEL = f"{CLEAR}evil-model"
HOSTILE_NAME = f"{RED}red{TITLE}"


def hostile_record(peer_id: str) -> PeerRecord:
    return make_record(
        peer_id=peer_id,
        name=HOSTILE_NAME,
        model_id=HOSTILE_MODEL,
        end=2,
        device=f"cpu{UP}",
        version=f"0.1{CLEAR}",
        addrs=(f"/ip4/10.0.0.1/tcp/1{UP}{UP}\u202e",),
        devices=(DeviceInfo(type=f"cpu{RED}", name=f"x{TITLE}", memory_bytes=1 << 30, cores=4),),
        region=f"eu{RED}",
    )


@pytest.fixture(scope="module")
def hostile_swarm(tmp_path_factory):
    """A real bootstrap node, and a hostile peer's signed entries stored through it."""
    workdir = tmp_path_factory.mktemp("escapes")
    with LocalSwarm(workdir) as local:
        initial_peers = local.start_bootstrap()
        identity = load_or_create_identity(workdir / "hostile.key")
        dht = start_dht(initial_peers, identity, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        try:
            expiration = get_dht_time() + 600
            record = hostile_record(identity.peer_id.to_base58())
            entry = ModelEntry(HOSTILE_MODEL, num_blocks=2).to_bytes()
            peer_id = identity.peer_id.to_base58()
            assert dht.store(index_key(peer_id), entry, expiration, subkey=identity.owner_marker)
            assert dht.store(
                record_key(HOSTILE_MODEL, peer_id),
                record.to_bytes(),
                expiration,
                subkey=identity.owner_marker,
            )
            yield initial_peers
        finally:
            shutdown_dht(dht, 5)


def run_status(initial_peers: list[str], *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "status",
            "--initial-peers",
            *initial_peers,
            *flags,
        ],
        capture_output=True,
        timeout=120,
    )


def control_bytes(data: bytes) -> set[int]:
    """C0 controls other than newline, DEL, and the C1 range as UTF-8 would carry it."""
    text = data.decode("utf-8")
    return {
        ord(ch) for ch in text if (ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) < 0xA0 or ch == "\u202e"
    }


def test_status_shows_a_hostile_peers_text_escaped(hostile_swarm):
    result = run_status(hostile_swarm)
    out = result.stdout.decode("utf-8")
    assert b"\x1b" not in result.stdout and not control_bytes(result.stdout), out
    assert "\\x1b[31mred" in out, out  # the name is there, readable, cut to its column
    assert "model \\x1b[2Jevil-model: 2 blocks" in out, out
    assert "\\x1b[1A" in out and "\\u202e" in out, out  # the address, cursor moves and all
    assert "cpu\\x1b[31m" in out, out  # the device column


def test_status_json_carries_hostile_text_as_json_escapes(hostile_swarm):
    result = run_status(hostile_swarm, "--json")
    assert b"\x1b" not in result.stdout and not control_bytes(result.stdout)
    models = json.loads(result.stdout)["models"]
    assert [m["model_id"] for m in models] == [HOSTILE_MODEL]  # the data itself is unchanged
