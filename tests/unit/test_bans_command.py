"""`hexswarm bans` (swarm/commands/bans_command.py): an operator lists this machine's bans and
lifts one, and a running peer stops refusing a lifted peer (peer/evidence_service.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from hexswarm.swarm.commands.cli import main
from hexswarm.swarm.trust.bans import BAN_TTL_S, Ban, add_ban, bans_path, load_bans

LIAR, OTHER = "QmLiarLiarLiarLiarLiarLiarLiarLiarLiarLiarLiar1", "QmOtherOtherOtherOtherOtherOtherOtherOther2"


@pytest.fixture
def bans_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HEXSWARM_CACHE_DIR", str(tmp_path))
    now = time.time()
    add_ban(Ban(LIAR, "llama-tiny", 0, 2, "re-checked evidence 0123 sent by ...abcdefgh", now - 3600))
    add_ban(Ban(OTHER, "llama-tiny", 2, 4, "a witness and a third peer disagreed", now - 60))
    return bans_path()


def test_bans_lists_each_ban_with_its_reason_and_when_it_expires(bans_file, capsys):
    assert main(["bans"]) == 0
    out = capsys.readouterr().out
    assert LIAR in out and OTHER in out and "re-checked evidence 0123" in out and "expires" in out
    assert main(["bans", "--json"]) == 0
    rows = {row["peer_id"]: row for row in json.loads(capsys.readouterr().out)["bans"]}
    assert rows[LIAR]["model_id"] == "llama-tiny" and rows[LIAR]["blocks"] == [0, 2]
    assert rows[LIAR]["expires"] == pytest.approx(rows[LIAR]["time"] + BAN_TTL_S)


def test_lift_removes_one_ban_and_an_unknown_one_is_an_error(bans_file, capsys):
    assert main(["bans", "--lift", LIAR]) == 0
    assert set(load_bans(bans_file)) == {OTHER}
    assert "lifted" in capsys.readouterr().out
    assert main(["bans", "--lift", LIAR]) == 1  # nothing to lift
    assert "no ban" in capsys.readouterr().err
    assert set(load_bans(bans_file)) == {OTHER}


def test_bans_with_no_file_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEXSWARM_CACHE_DIR", str(tmp_path / "empty"))
    assert main(["bans"]) == 0
    assert "no bans" in capsys.readouterr().out


def test_bans_imports_no_torch():
    code = "import sys; from hexswarm.swarm.commands.cli import main; main(['bans']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip().endswith("False"), result.stdout + result.stderr


def test_a_running_peer_stops_refusing_a_lifted_peer(bans_file):
    from hexswarm.peer.evidence_service import EvidenceService

    service = EvidenceService(None, None, None, None, "float32", None)  # only its bans are used here
    refused = service.banned  # the very set the stream server checks (peer/server.py)
    assert {LIAR, OTHER} <= refused
    assert main(["bans", "--lift", LIAR]) == 0
    asyncio.run(service.refresh_bans())
    assert LIAR not in refused and OTHER in refused
