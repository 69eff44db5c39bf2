"""`hexswarm monitor` end to end: a real swarm, the page in headless Chromium (selenium).

Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them); skipped without them.
"""

from __future__ import annotations

import json
import sys
import urllib.request

import pytest

from hexswarm.swarm.tools.launcher import free_port
from tests.integration.browser import skip_without_chromium, start_browser, wait_for

pytestmark = pytest.mark.integration

skip_without_chromium()


def start_monitor(swarm, refresh: float = 1.0):
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "hexswarm.swarm.commands.cli",
        "monitor",
        "--initial-peers",
        *swarm.initial_peers,
        "--port",
        str(port),
        "--refresh",
        str(refresh),
    ]
    # the line is printed once the port is bound (client/http_serve.py): the page loads at once
    proc = swarm.local.start_command("monitor", args, ready="monitor: http", timeout=120)
    return proc, f"http://127.0.0.1:{port}"


def _shows_online(shown: dict, names) -> bool:
    return all(shown["peers"].get(name) == "online" for name in names)


def page_state(browser, model_id: str) -> dict:
    """What the page shows for one model: peer name -> state, and the online count per block.

    Read in one script call, so a redraw between two element look-ups cannot tear the result."""
    return browser.execute_script(
        """
        const section = document.querySelector(`section[data-model="${arguments[0]}"]`);
        if (!section) throw new Error("no section for this model yet");
        const peers = {};
        for (const row of section.querySelectorAll("tr[data-peer]"))
            peers[row.getAttribute("data-peer")] = row.getAttribute("data-state");
        const coverage = [...section.querySelectorAll("tr[data-coverage] td")].map(c => parseInt(c.textContent, 10));
        return {peers: peers, coverage: coverage};
        """,
        model_id,
    )


@pytest.fixture(scope="module")
def extra_model(shared_swarm, make_model):
    """A second model served by two peers of its own, so the test can stop one freely."""
    model_dir = make_model(arch="llama", layers=4, seed=21)
    peers = {
        name: shared_swarm.local.start_peer(model_dir, layers, name, "--announce-period", "1", wait=False)
        for name, layers in (("mon-a", "0:2"), ("mon-b", "2:4"))
    }
    for proc in peers.values():
        shared_swarm.local.wait_for_log(proc, "online:", timeout=180)
    yield model_dir, peers
    for proc in peers.values():
        shared_swarm.local.stop(proc)


def test_monitor_page_shows_peers_and_coverage_live(swarm, extra_model, tmp_path):
    from hexswarm.swarm.models.model_spec import load_model_spec

    model_dir, extra_peers = extra_model
    main_id, extra_id = load_model_spec(swarm.model_dir).model_id, load_model_spec(model_dir).model_id
    proc, url = start_monitor(swarm)
    browser = start_browser()
    try:
        browser.get(url)
        shown = wait_for(lambda: page_state(browser, main_id), 60, "the main model's section")
        # The shared swarm's model may also show a peer another test started and stopped, until
        # its record expires: every peer of the swarm must be shown, online.
        wait_for(lambda: _shows_online(page_state(browser, main_id), swarm.peers), 30, "every peer online")
        shown = page_state(browser, main_id)
        assert len(shown["coverage"]) == 6 and min(shown["coverage"]) >= 1, shown
        wait_for(lambda: page_state(browser, extra_id)["coverage"] == [1, 1, 1, 1], 30, "the extra model")
        browser.save_screenshot(str(tmp_path / "monitor-before.png"))

        # without a script (curl, a text browser) the page shows the same, rendered on the server
        served = urllib.request.urlopen(url, timeout=10).read().decode()
        assert f'data-rendered-model="{extra_id}"' in served and "mon-a" in served and "mon-b" in served
        assert "every block served" in served and "connecting…" not in served
        snapshot = json.loads(urllib.request.urlopen(f"{url}/api/swarm", timeout=10).read())
        by_id = {m["model_id"]: m for m in snapshot["models"]}
        assert {p["name"] for p in by_id[extra_id]["peers"]} == {"mon-a", "mon-b"}
        assert all(p["rtt_ms"] is not None and p["tp"] >= 1 for p in by_id[main_id]["peers"])

        swarm.local.stop(extra_peers["mon-b"])  # the page must notice: blocks 2:4 lose their only peer
        wait_for(lambda: page_state(browser, extra_id)["coverage"] == [1, 1, 0, 0], 30, "blocks 2:4 missing")
        assert page_state(browser, extra_id)["peers"].get("mon-b") in (None, "leaving")
        wait_for(lambda: "missing blocks 2:4" in browser.page_source, 10, "the missing-blocks line")
        browser.save_screenshot(str(tmp_path / "monitor-after.png"))
        assert (tmp_path / "monitor-after.png").stat().st_size > 10_000
    finally:
        browser.quit()
        exit_code = swarm.local.stop(proc)  # SIGTERM, as docker stop and systemd send
    # a clean stop: status 0, no traceback and no p2pd "use of closed network connection" line
    log = proc.log()
    assert exit_code == 0, log[-2000:]
    assert "Traceback" not in log and "use of closed network connection" not in log, log[-2000:]
