"""The monitor page's server-rendered first state (client/monitor_render.py): plain data."""

from hexswarm.client.monitor_data import model_entry
from hexswarm.client.monitor_render import render_models, render_updated
from tests.unit.record_cases import make_record


def test_peers_and_missing_blocks_are_rendered_and_names_escaped():
    records = [make_record(peer_id="QmAAAAAAAAAAAAAAAA", name="<script>x</script>", start=0, end=2)]
    snapshot = {"time": 1.0, "models": [model_entry("m-1", 4, records, {})]}
    html = render_models(snapshot)
    assert "missing blocks 2:4" in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<script>" not in html and 'data-rendered-model="m-1"' in html
    assert "server-rendered" in render_updated(snapshot)


def test_before_the_first_snapshot_the_page_says_so():
    assert "first snapshot" in render_models(
        {"time": None, "models": [], "error": "first snapshot not taken yet"}
    )
    assert render_updated({"time": None}) == "connecting…"
