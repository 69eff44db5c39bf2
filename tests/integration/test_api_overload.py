"""`hexswarm api` under overload, over a real swarm: a full queue gets 429 with Retry-After at
once, a client that leaves while queued frees its place and never reaches a peer, an abandoned
request stops generating, and an oversized body gets 413 before it is read.

The server runs with one running slot and one queue place, so two long requests fill it.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.integration.test_api import API_KEY, get, keyed_api, open_sessions, root, wait_for

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")

BODY_LIMIT = 4096


@pytest.fixture(scope="module")
def overloaded(shared_swarm):
    limits = ["--max-concurrent", "1", "--max-queue", "1", "--max-body-bytes", str(BODY_LIMIT)]
    with keyed_api(shared_swarm, "api-overload", *limits) as served:
        yield served


@pytest.fixture(scope="module")
def served_name(shared_swarm):
    return shared_swarm.model_dir.name


def long_request(name: str, stream: bool) -> dict:
    # ignore_eos: 1900 tokens keep the tiny swarm busy for several seconds (~100 tokens/s)
    prompt = "Peers announce"
    return {"model": name, "prompt": prompt, "max_tokens": 1900, "ignore_eos": True, "stream": stream}


class RawRequest:
    """A POST on its own socket, sent whole and then left unread until `close()`: a client that
    goes away is a closed socket."""

    def __init__(self, url: str, path: str, body: dict):
        parts = urlsplit(url)
        data = json.dumps(body).encode()
        head = (
            f"POST {parts.path}{path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        self.sock.sendall(head.encode() + data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawRequest:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(url: str) -> tuple[int, int]:
    """(generating, queued) as /health reports them."""
    _, health = get(root(url) + "/health")
    return health["generating"], health["queued"]


def wait_idle(url: str, model) -> None:
    assert wait_for(lambda: load(url) == (0, 0), 30), load(url)
    assert wait_for(lambda: not any(open_sessions(model).values()), 15), open_sessions(model)


def test_a_full_queue_gets_429_with_retry_after_at_once(overloaded, model, served_name):
    client, _, url = overloaded
    wait_idle(url, model)
    with RawRequest(url, "/completions", long_request(served_name, stream=True)):
        assert wait_for(lambda: load(url) == (1, 0), 30), load(url)
        with RawRequest(url, "/completions", long_request(served_name, stream=False)):
            assert wait_for(lambda: load(url) == (1, 1), 10), load(url)
            began = time.monotonic()
            with pytest.raises(openai.RateLimitError) as refused:
                client.completions.create(model=served_name, prompt="x", max_tokens=4)
            took = time.monotonic() - began
    assert took < 1.0, took
    assert int(refused.value.response.headers["Retry-After"]) >= 1
    assert refused.value.body["code"] == "queue_full" and "capacity" in refused.value.body["message"]
    wait_idle(url, model)  # both clients left: their places are free again
    reply = client.completions.create(model=served_name, prompt="x", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4


def test_a_client_that_leaves_while_queued_frees_its_place_and_never_reaches_a_peer(
    overloaded, model, served_name
):
    client, proc, url = overloaded
    wait_idle(url, model)
    later = {}

    def ask_later():
        reply = client.completions.create(model=served_name, prompt="x", max_tokens=4, temperature=0)
        later["tokens"] = reply.usage.completion_tokens

    with RawRequest(url, "/completions", long_request(served_name, stream=True)) as running:
        assert wait_for(lambda: load(url) == (1, 0), 30), load(url)
        with RawRequest(url, "/completions", long_request(served_name, stream=False)):
            assert wait_for(lambda: load(url) == (1, 1), 10), load(url)
        # The queued client is gone: its place frees, so the next request queues, not 429.
        assert wait_for(lambda: load(url) == (1, 0), 10), load(url)
        assert wait_for(lambda: "cancelled before it ran" in proc.log(), 10), proc.log()[-2000:]
        asker = threading.Thread(target=ask_later)
        asker.start()
        assert wait_for(lambda: load(url) == (1, 1), 10), load(url)
        running.close()
        asker.join(60)
    # The short request ran next: the one that left (ahead of it, and 1900 tokens long) did not.
    assert later == {"tokens": 4}
    wait_idle(url, model)
    quiet_until = time.monotonic() + 3  # peers announce every second; a session would show
    while time.monotonic() < quiet_until:
        assert not any(open_sessions(model).values()) and load(url) == (0, 0)
        time.sleep(0.25)


def test_an_abandoned_non_streaming_request_stops_generating(overloaded, model, served_name):
    _, proc, url = overloaded
    wait_idle(url, model)
    with RawRequest(url, "/completions", long_request(served_name, stream=False)):
        assert wait_for(lambda: sum(open_sessions(model).values()) >= 2, 15), open_sessions(model)
    left = time.monotonic()
    assert wait_for(lambda: not any(open_sessions(model).values()), 15), open_sessions(model)
    assert time.monotonic() - left < 15  # far less than the ~19 s the 1900 tokens would take
    assert wait_for(lambda: "the client left; generation stopped" in proc.log(), 10), proc.log()[-2000:]
    assert wait_for(lambda: load(url) == (0, 0), 10), load(url)


def test_an_oversized_body_gets_413_before_it_is_read(overloaded, served_name):
    client, _, url = overloaded
    body = json.dumps({"model": served_name, "prompt": "x" * (2 * BODY_LIMIT)}).encode()
    # A declared length over the limit is refused before the body is read: only its first KiB is sent.
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.putrequest("POST", f"{parts.path}/completions")
        for name, value in (("Content-Type", "application/json"), ("Authorization", f"Bearer {API_KEY}")):
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body[:1024])
        answer = connection.getresponse()
        assert answer.status == 413
        assert json.loads(answer.read())["error"]["code"] == "request_too_large"
    finally:
        connection.close()
    # Without a Content-Length (chunked), the body is counted as it arrives: a little past the
    # limit is sent, and no end, so only the count can have stopped it (sending all of it would
    # race the server's close with a broken pipe).
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.putrequest("POST", f"{parts.path}/completions")
        for name, value in (("Content-Type", "application/json"), ("Authorization", f"Bearer {API_KEY}")):
            connection.putheader(name, value)
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        try:
            for i in range(0, BODY_LIMIT + 4096, 1024):
                chunk = body[i : i + 1024]
                connection.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: its answer is read below
        answer = connection.getresponse()
        assert answer.status == 413
        assert json.loads(answer.read())["error"]["code"] == "request_too_large"
    finally:
        connection.close()
    reply = client.completions.create(model=served_name, prompt="x", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4  # a body under the limit is served
