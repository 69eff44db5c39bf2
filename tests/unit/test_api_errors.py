"""The API's error mapping over real HTTP (uvicorn in a thread, a local tiny model): only a request
that cannot be served as asked is a 4xx; an error inside (a ValueError from routing or the client
library, a bug) is a 500 with its traceback in the log, never the client's 400."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request

import pytest

from hexswarm.client.session import SequenceTooLongError
from hexswarm.client.swarm_client import MissingBlocksError
from hexswarm.swarm.tools.launcher import free_port


@pytest.fixture(scope="module")
def served(make_model):
    import uvicorn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.client.api.server import ApiConfig, create_app

    directory = make_model(arch="llama", layers=2)
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    port = free_port()
    app = create_app(model, tokenizer, ApiConfig(name="tiny"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", model, tokenizer
    server.should_exit = True
    thread.join(15)


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


COMPLETION = {"model": "tiny", "prompt": "A swarm", "max_tokens": 4, "temperature": 0}


def raising(error: Exception):
    def generate(*args, **kwargs):
        raise error

    return generate


def test_a_value_error_inside_generation_is_a_500_with_a_logged_traceback(served, monkeypatch, caplog):
    url, model, _ = served
    monkeypatch.setattr(model, "generate", raising(ValueError("view has a peer with throughput nan")))
    with caplog.at_level(logging.ERROR, logger="hexswarm.client.api.server"):
        status, body = post(f"{url}/v1/completions", COMPLETION)
    assert status == 500 and body["error"]["type"] == "server_error"
    assert "ValueError" in body["error"]["message"] and "nan" not in body["error"]["message"]
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], ValueError)]
    assert logged, caplog.text


def test_a_value_error_before_generation_is_a_500_too(served, monkeypatch):
    url, _, tokenizer = served
    monkeypatch.setattr(type(tokenizer), "__call__", raising(ValueError("tokenizer broke")))
    status, body = post(f"{url}/v1/completions", COMPLETION)
    assert status == 500 and body["error"]["type"] == "server_error"


@pytest.mark.parametrize(
    "error, status, code",
    [
        (SequenceTooLongError("the peers of blocks 0:2 accept at most 32 tokens"), 400, None),
        (MissingBlocksError("m", [0, 1], 1.0), 503, "missing_blocks"),
    ],
)
def test_what_the_swarm_cannot_serve_keeps_its_status(served, monkeypatch, error, status, code):
    url, model, _ = served
    monkeypatch.setattr(model, "generate", raising(error))
    got, body = post(f"{url}/v1/completions", COMPLETION)
    assert got == status and body["error"]["code"] == code


def test_request_validation_is_still_a_400(served):
    url, _, _ = served
    status, body = post(f"{url}/v1/completions", {**COMPLETION, "max_tokens": 0})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


def test_a_local_model_is_healthy_and_without_a_key_the_docs_are_served(served):
    url, _, _ = served
    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        assert answer.status == 200 and json.loads(answer.read())["status"] == "ok"
    with urllib.request.urlopen(f"{url}/docs", timeout=10) as answer:
        assert answer.status == 200


def _raw_post(url: str, data: bytes, content_type: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": content_type} if content_type else {}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_a_body_that_is_not_json_is_told_so_in_words(served):
    url = served[0]
    status, body = _raw_post(f"{url}/v1/completions", b'{"model": "tiny", "prompt": ', "application/json")
    assert status == 400 and body["error"]["message"].startswith("the body is not valid JSON"), body
    assert body["error"]["param"] is None
    status, body = _raw_post(f"{url}/v1/completions", json.dumps(COMPLETION).encode(), "text/plain")
    assert status == 400, body
    assert body["error"]["message"] == (
        "send the body as JSON, with Content-Type: application/json (it came as text/plain)"
    ), body


def test_a_prompt_over_the_context_blames_the_prompt_not_max_tokens(served):
    url, model, _ = served
    context = model.config.max_position_embeddings
    too_long = {**COMPLETION, "prompt": [5] * (context + 5)}
    status, body = post(f"{url}/v1/completions", too_long)
    assert status == 400 and body["error"]["param"] == "prompt", body
    assert f"the prompt is {context + 5:,} tokens" in body["error"]["message"]
    fits = {**COMPLETION, "prompt": [5] * (context - 2), "max_tokens": 8}
    status, body = post(f"{url}/v1/completions", fits)
    assert status == 400 and body["error"]["param"] == "max_tokens", body
    assert "ask for at most 2 tokens" in body["error"]["message"]
