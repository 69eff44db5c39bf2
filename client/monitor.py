"""`hexswarm monitor`: a live web page of the swarm (block coverage map, peers, speeds).

A background thread reads the DHT and pings the peers every `--refresh` seconds
(client/monitor_data.py); the page (client/monitor_page.html, plain HTML and JavaScript, no
external assets) polls `/api/swarm` for that snapshot and redraws.
"""

from __future__ import annotations

import argparse
import logging
import threading
from importlib import resources
from typing import TYPE_CHECKING

from hexswarm.swarm.commands import cli_args

if TYPE_CHECKING:  # fastapi and hivemind load when the monitor runs, not for --help
    from fastapi import FastAPI

    from hexswarm.swarm.coordinator.records import Trust

logger = logging.getLogger(__name__)


class SwarmWatcher:
    """Keeps the latest snapshot of the swarm, refreshed by a daemon thread."""

    def __init__(self, swarm, refresh_s: float, models: dict[str, int] | None = None, trust: Trust = None):
        self.swarm, self.refresh_s = swarm, refresh_s
        self.models = models  # model id -> blocks to watch; None: every model announced
        self.trust = trust  # whose coordinator lease and plans count, as for the swarm's peers
        self.latest: dict = {"time": None, "models": [], "error": "first snapshot not taken yet"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="monitor-watcher", daemon=True)

    def start(self) -> SwarmWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.refresh_s + 15)

    def _loop(self) -> None:
        from hexswarm.client.monitor_data import collect

        while not self._stop.is_set():
            try:
                self.latest = {**collect(self.swarm, self.models, self.trust), "refresh_s": self.refresh_s}
            except Exception as e:  # a DHT hiccup must not end the monitor; the page shows it
                logger.warning("reading the swarm failed: %s", e)
                self.latest = {**self.latest, "error": f"reading the swarm failed: {e}"}
            self._stop.wait(self.refresh_s)


def create_app(watcher: SwarmWatcher) -> FastAPI:
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse

    from hexswarm.client.monitor_render import render_models, render_updated

    app = FastAPI(title="hexswarm monitor")
    page = resources.files(__package__).joinpath("monitor_page.html").read_text(encoding="utf-8")

    # no return annotations: FastAPI would resolve them in this module's globals, which lack these names
    @app.get("/", response_class=HTMLResponse)
    async def index():
        snapshot = watcher.latest  # the page as it stands now; its script takes over from here
        return page.replace(
            '<div id="models"></div>', f'<div id="models">{render_models(snapshot)}</div>'
        ).replace(
            '<div id="updated">connecting…</div>', f'<div id="updated">{render_updated(snapshot)}</div>'
        )

    @app.get("/api/swarm")
    async def snapshot():
        return JSONResponse(watcher.latest, headers={"Cache-Control": "no-store"})

    return app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_initial_peers(parser)
    cli_args.add_client_host_maddrs(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address the web page is served on")
    parser.add_argument("--port", type=cli_args.port, default=8080, help="port the web page is served on")
    parser.add_argument(
        "--refresh", type=cli_args.positive_float, default=2.0, help="seconds between snapshots"
    )
    cli_args.add_model_argument(parser, required=False)


def run(args: argparse.Namespace) -> int:
    from hexswarm.client.http_serve import serve_until_stopped
    from hexswarm.client.swarm_client import SwarmClient
    from hexswarm.swarm.coordinator.records import trust_from

    models = None if args.model is None else dict([cli_args.model_identity(args.model)])
    swarm = SwarmClient.connect(args.initial_peers, args.host_maddrs)
    # The swarm's default trust (any member of a private swarm): as `hexswarm status` does, the
    # monitor shows the lease and plans that the swarm's own peers follow.
    trust = trust_from(None)
    watcher = SwarmWatcher(swarm, args.refresh, models, trust).start()
    ready = f"monitor: http://{args.host}:{args.port}/ (JSON at /api/swarm)"
    try:
        serve_until_stopped(create_app(watcher), args.host, args.port, ready)
    finally:
        watcher.stop()
        swarm.shutdown()
    return 0
