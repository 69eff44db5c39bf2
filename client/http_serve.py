"""Serving a web app (the API, the monitor) until SIGINT or SIGTERM, both clean stops.

uvicorn shuts down gracefully on either signal and then raises the signal again, so that the
process ends as the signal asked. SIGTERM's default action ends the process at once, before the
caller's `finally` closes its swarm connection: `docker stop` and systemd would leave the DHT
node to notice its owner gone. Here SIGTERM raises SystemExit instead, so the caller's cleanup
runs and the exit status is 0, as after Ctrl-C.

The ready line (`api: serving ...`, `monitor: http://...`) is printed once the port is bound:
whatever waits for it (a script, a test, a supervisor) can connect at once.
"""

from __future__ import annotations

import signal
from typing import Any


def serve_until_stopped(app: Any, host: str, port: int, ready_line: str) -> None:
    """Runs `app` with uvicorn on host:port until SIGINT or SIGTERM; prints `ready_line` once
    it listens."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:  # uvicorn exits instead when the port cannot be bound
                print(ready_line, flush=True)

    previous = signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        _Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)
