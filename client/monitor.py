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

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from client.monitor_data import collect
from swarm.coordinator.records import Trust, trust_from

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
        while not self._stop.is_set():
            try:
                self.latest = {**collect(self.swarm, self.models, self.trust), "refresh_s": self.refresh_s}
            except Exception as e:  # a DHT hiccup must not end the monitor; the page shows it
                logger.warning("reading the swarm failed: %s", e)
                self.latest = {**self.latest, "error": f"reading the swarm failed: {e}"}
            self._stop.wait(self.refresh_s)


def create_app(watcher: SwarmWatcher) -> FastAPI:
    app = FastAPI(title="hexswarm monitor")
    page = resources.files("client").joinpath("monitor_page.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    @app.get("/api/swarm")
    async def snapshot() -> JSONResponse:
        return JSONResponse(watcher.latest, headers={"Cache-Control": "no-store"})

    return app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--initial-peers", nargs="+", help="multiaddrs of swarm members")
    where.add_argument("--public", action="store_true", help="watch the public swarm")
    parser.add_argument(
        "--host-maddrs",
        nargs="+",
        default=None,
        help="p2p addresses to listen on (default: none; this client only dials out and asks no router for a port)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--refresh", type=float, default=2.0, help="seconds between snapshots")
    parser.add_argument(
        "--model",
        default=None,
        help="only this model: a built-in name, a GGUF file or a checkpoint directory",
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from client.swarm_client import SwarmClient
    from swarm.dht import public_initial_peers

    models = None
    if args.model is not None:
        from swarm.model_spec import model_identity

        model_id, num_blocks = model_identity(args.model)
        models = {model_id: num_blocks}
    swarm = SwarmClient.connect(
        public_initial_peers() if args.public else args.initial_peers, args.host_maddrs
    )
    # The swarm's default trust (any member of a private swarm, none of the public one): a
    # stranger's stolen lease is not shown as the holder, as `hexswarm status` does not show it.
    trust = trust_from(None, args.public)
    watcher = SwarmWatcher(swarm, args.refresh, models, trust).start()
    print(f"monitor: http://{args.host}:{args.port}/ (JSON at /api/swarm)", flush=True)
    try:
        uvicorn.run(create_app(watcher), host=args.host, port=args.port, log_level="warning")
    finally:
        watcher.stop()
        swarm.shutdown()
    return 0
