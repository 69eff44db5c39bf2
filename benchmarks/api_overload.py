"""The API under overload: what `hexswarm api --max-concurrent 1 --max-queue 1` answers, and how fast.

A bootstrap and one peer serving a tiny random model (6 layers) run on this machine, with a
`hexswarm api` over them that runs one generation at a time and queues one more. The situations
are those that tests/integration/test_api.py and test_api_overload.py set up; this times them.
Prints one JSON line:

- `health_while_tokenizing`: a 950 KB prompt is posted (the server tokenizes it, about a second
  of CPU, then refuses it as longer than the context); meanwhile `/health` and `/v1/models` are
  asked back to back: the slowest answer of each (`max_ms`) against the prompt's own time;
- `third_request`: one long generation running and one queued, a third request's status (429
  expected) and the ms it took to come back;
- `declared_64mib_body`: a POST whose Content-Length says 64 MiB, with only 1 KiB sent: its
  status (413 expected) and ms;
- `left_client`: a non-streaming 1,900-token request whose client closes its socket once it
  runs: the seconds from the close until `/health` reports nothing generating, and whether the
  API logged that it stopped.

Run: python benchmarks/api_overload.py [--save]
(--save: also write the line to benchmarks/results/api_overload.json)
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench_results import save, stamp

from hexswarm.swarm.commands.tiny_model import make_tiny_model
from hexswarm.swarm.tools.launcher import LocalSwarm, free_port

SHAPE = dict(hidden=256, layers=6, heads=8, kv_heads=4)
KEY = "bench-key"
BIG_PROMPT = "A swarm of volunteers serves a model. " * 25_000  # 950 KB, under the 1 MiB body limit


def request(url: str, body: dict | None = None) -> tuple[int, float]:
    """(status, ms) of a GET (no body) or a JSON POST."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, headers=headers), timeout=120
        ) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as refused:
        status = refused.code
    return status, 1000 * (time.perf_counter() - began)


def load(base: str) -> tuple[int, int]:
    """(generating, queued) as /health reports them."""
    with urllib.request.urlopen(base + "/health", timeout=30) as r:
        health = json.loads(r.read())
    return health["generating"], health["queued"]


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def raw_post(port: int, body: dict) -> socket.socket:
    """A POST sent whole on its own socket and left unread: closing the socket is a client leaving."""
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.encode() + data)
    return sock


def health_while_tokenizing(base: str, name: str) -> dict:
    outcome: dict = {}

    def big() -> None:
        outcome["status"], outcome["ms"] = request(
            base + "/v1/completions", {"model": name, "prompt": BIG_PROMPT}
        )

    waits: dict[str, list[float]] = {"/health": [], "/v1/models": []}
    worker = threading.Thread(target=big)
    worker.start()
    while worker.is_alive():
        for path, times in waits.items():
            times.append(request(base + path)[1])
    worker.join()
    return {
        "prompt_kb": round(len(BIG_PROMPT) / 1000),
        "prompt_status": outcome["status"],
        "prompt_ms": round(outcome["ms"], 1),
        **{f"{p.strip('/').replace('/', '_')}_max_ms": round(max(t), 1) for p, t in waits.items()},
        **{f"{p.strip('/').replace('/', '_')}_answers": len(t) for p, t in waits.items()},
    }


def long_body(name: str, stream: bool) -> dict:
    return {
        "model": name,
        "prompt": "Peers announce",
        "max_tokens": 1900,
        "ignore_eos": True,
        "stream": stream,
    }


def third_request(base: str, port: int, name: str) -> dict:
    running = raw_post(port, long_body(name, stream=True))
    try:
        assert wait_until(lambda: load(base) == (1, 0), 30), load(base)
        queued = raw_post(port, long_body(name, stream=False))
        try:
            assert wait_until(lambda: load(base) == (1, 1), 10), load(base)
            status, ms = request(base + "/v1/completions", {"model": name, "prompt": "x", "max_tokens": 4})
        finally:
            queued.close()
    finally:
        running.close()
    wait_until(lambda: load(base) == (0, 0), 30)
    return {"status": status, "ms": round(ms, 1)}


def declared_64mib_body(port: int) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        began = time.perf_counter()
        connection.putrequest("POST", "/v1/completions")
        connection.putheader("Authorization", f"Bearer {KEY}")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(64 << 20))
        connection.endheaders(b"{" + b" " * 1023)
        answer = connection.getresponse()
        answer.read()
        return {"status": answer.status, "ms": round(1000 * (time.perf_counter() - began), 2)}
    finally:
        connection.close()


def left_client(base: str, port: int, name: str, api) -> dict:
    sock = raw_post(port, long_body(name, stream=False))
    assert wait_until(lambda: load(base) == (1, 0), 30), load(base)
    time.sleep(1.0)  # a second of generating before the client goes
    sock.close()
    left = time.perf_counter()
    stopped = wait_until(lambda: load(base)[0] == 0, 60)
    return {
        "stopped_s": round(time.perf_counter() - left, 2) if stopped else None,
        "logged": "the client left; generation stopped" in api.log(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/api_overload.json")
    args = parser.parse_args()
    started = stamp()
    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-") as tmp:
        model_dir = make_tiny_model(Path(tmp) / "tiny", seed=0, **SHAPE)
        with LocalSwarm(Path(tmp) / "logs", env={"HEXSWARM_CACHE_DIR": str(Path(tmp) / "cache")}) as swarm:
            swarm.start_bootstrap()
            swarm.start_peer(model_dir, f"0:{SHAPE['layers']}", "peer", timeout=300)
            port = free_port()
            limits = ["--max-concurrent", "1", "--max-queue", "1", "--api-key", KEY]
            argv = [sys.executable, "-m", "hexswarm.swarm.commands.cli", "api", "--initial-peers"]
            argv += [*swarm.initial_peers, "--model", str(model_dir), "--port", str(port), *limits]
            api = swarm.start_command("api", argv, ready="api: serving", timeout=300)
            base, name = f"http://127.0.0.1:{port}", model_dir.name
            request(base + "/v1/completions", {"model": name, "prompt": "x", "max_tokens": 4})  # warm up
            result = {
                "bench": "api_overload",
                "layers": SHAPE["layers"],
                "limits": " ".join(limits[:4]),
                "health_while_tokenizing": health_while_tokenizing(base, name),
                "third_request": third_request(base, port, name),
                "declared_64mib_body": declared_64mib_body(port),
                "left_client": left_client(base, port, name, api),
            }
    print(json.dumps(result), flush=True)
    if args.save:
        save("api_overload", {**result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
