"""The monitor page's first state, rendered on the server: the page works without scripts (curl,
a text browser, a test), and its script replaces it with live updates on its first fetch.

Everything a peer wrote (names, addresses) is escaped: peers choose their names.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from hexswarm.swarm.trust.records import block_ranges

COLUMNS = ("name", "peer id", "layers", "role", "state", "ms/blk", "sessions", "reach")


def render_models(snapshot: dict[str, Any]) -> str:
    """The #models fragment for `snapshot` (monitor_data.collect's JSON)."""
    if snapshot.get("error"):
        return f'<div class="bad">{escape(str(snapshot["error"]))}</div>'
    return "".join(_model(model) for model in snapshot.get("models", [])) or "<p>no models are announced</p>"


def render_updated(snapshot: dict[str, Any]) -> str:
    """The header's 'updated' line for `snapshot`."""
    taken = snapshot.get("time")
    if not taken:
        return "connecting…"
    return f"snapshot of {time.strftime('%H:%M:%S', time.localtime(taken))} (server-rendered)"


def _model(model: dict[str, Any]) -> str:
    missing = model.get("missing") or []
    coverage = (
        f'<span class="bad">missing blocks {escape(block_ranges(missing))}</span>'
        if missing
        else "every block served"
    )
    rows = "".join(_row(peer) for peer in model.get("peers", []))
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    return (
        f'<section class="card" data-rendered-model="{escape(model["model_id"])}"><h2>{escape(model["model_id"])}</h2>'
        f"<p>{model['num_blocks']} blocks: {coverage}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _row(peer: dict[str, Any]) -> str:
    ms = f"{peer.get('decode_ms_per_block', 0):.2f}" + (" ⚠" if peer.get("over_announced") else "")
    cells = (
        peer.get("name", ""),
        str(peer.get("peer_id", ""))[-8:],
        peer.get("layers", ""),
        peer.get("role", ""),
        peer.get("state", ""),
        ms,
        peer.get("open_sessions", ""),
        peer.get("reachability") or "-",
    )
    return "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>"
