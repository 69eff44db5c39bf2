"""`hexswarm api` against a real swarm, through the official `openai` package.

The server runs as its own process (`hexswarm api ...`); what it answers is checked
against `generate()` of an in-process DistributedModelForCausalLM on the same swarm.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hexswarm.swarm.tools.launcher import free_port
from hexswarm.swarm.trust.records import read_peer_records

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")

API_KEY = "test-key-123"
PROMPTS = ["A swarm of volunteers", "The quick brown fox", "Once upon a time", "Peers announce"]


def start_api(swarm, name: str, model_dir, *extra: str):
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "hexswarm.swarm.commands.cli",
        "api",
        "--initial-peers",
        *swarm.initial_peers,
        "--model",
        str(model_dir),
        "--port",
        str(port),
        *extra,
    ]
    proc = swarm.local.start_command(name, args, ready="api: serving", timeout=180)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_until_listening(client, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def keyed_api(swarm, name: str, *extra: str):
    """(openai client, process, base url) of an API over the swarm's model with API_KEY set."""
    proc, url = start_api(swarm, name, swarm.model_dir, "--api-key", API_KEY, *extra)
    try:
        client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=120)
        wait_until_listening(client)
        yield client, proc, url
    finally:
        swarm.local.stop(proc)


@pytest.fixture(scope="module")
def api(shared_swarm):
    with keyed_api(shared_swarm, "api") as served:
        yield served


@pytest.fixture(scope="module")
def tokenizer(shared_swarm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(shared_swarm.model_dir)


@pytest.fixture(scope="module")
def served_name(shared_swarm):
    return shared_swarm.model_dir.name


def generated_text(model, tokenizer, ids: list[int], **kwargs) -> str:
    out = model.generate(torch.tensor([ids]), **kwargs)
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


def test_models_lists_the_served_model(api, served_name):
    client, _, _ = api
    assert [m.id for m in client.models.list().data] == [served_name]


def test_completion_greedy_equals_generate(api, model, tokenizer, served_name):
    client, _, _ = api
    ids = tokenizer(PROMPTS[0]).input_ids
    expected = generated_text(model, tokenizer, ids, max_new_tokens=20, do_sample=False)
    got = client.completions.create(model=served_name, prompt=PROMPTS[0], max_tokens=20, temperature=0)
    assert got.choices[0].text == expected
    assert got.usage.prompt_tokens == len(ids)
    assert got.usage.completion_tokens == 20 and got.choices[0].finish_reason == "length"


def test_completion_seeded_sampling_equals_generate(api, model, tokenizer, served_name):
    client, _, _ = api
    ids = tokenizer(PROMPTS[1]).input_ids
    torch.manual_seed(7)
    expected = generated_text(
        model, tokenizer, ids, max_new_tokens=20, do_sample=True, temperature=0.8, top_p=0.9, top_k=0
    )
    got = client.completions.create(
        model=served_name, prompt=PROMPTS[1], max_tokens=20, temperature=0.8, top_p=0.9, seed=7
    )
    assert got.choices[0].text == expected
    other = client.completions.create(
        model=served_name, prompt=PROMPTS[1], max_tokens=20, temperature=0.8, top_p=0.9, seed=8
    )
    assert other.choices[0].text != expected  # the seed is honoured, not ignored


def test_chat_greedy_equals_generate_with_the_chat_template(api, model, tokenizer, served_name):
    client, _, _ = api
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a swarm?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    expected = generated_text(model, tokenizer, ids, max_new_tokens=16, do_sample=False)
    got = client.chat.completions.create(model=served_name, messages=messages, max_tokens=16, temperature=0)
    assert got.choices[0].message.content == expected
    assert got.choices[0].message.role == "assistant"
    assert got.usage.prompt_tokens == len(ids)


def test_ignore_eos_runs_past_the_models_end_to_max_tokens(api, served_name):
    client, _, _ = api
    ended = client.completions.create(model=served_name, prompt=PROMPTS[1], max_tokens=40, temperature=0)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens < 40
    full = client.completions.create(
        model=served_name, prompt=PROMPTS[1], max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
    )
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 40
    assert full.choices[0].text.startswith(ended.choices[0].text)


def test_streaming_sends_the_same_text_with_usage(api, model, tokenizer, served_name):
    client, _, _ = api
    whole = client.completions.create(model=served_name, prompt=PROMPTS[2], max_tokens=24, temperature=0)
    chunks = list(
        client.completions.create(
            model=served_name,
            prompt=PROMPTS[2],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # really streamed
    assert chunks[-1].usage.completion_tokens == 24
    chat = client.chat.completions.create(
        model=served_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    deltas = [c.choices[0].delta.content or "" for c in chat if c.choices]
    expected = client.chat.completions.create(
        model=served_name, messages=[{"role": "user", "content": "hi"}], max_tokens=12, temperature=0
    )
    assert "".join(deltas) == expected.choices[0].message.content


def test_stop_strings_cut_the_text(api, served_name):
    client, _, _ = api
    full = client.completions.create(model=served_name, prompt=PROMPTS[0], max_tokens=30, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = client.completions.create(
        model=served_name, prompt=PROMPTS[0], max_tokens=30, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=served_name, prompt=PROMPTS[0], max_tokens=30, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text[: text.index(stop)]


def test_bad_requests_get_400_in_openai_shape(api, served_name):
    client, _, url = api
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=served_name, prompt="x", max_tokens=4, n=2)
    assert caught.value.body["param"] == "n" and caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=served_name, prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=served_name, prompt="x", max_tokens=4, temperature=3)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=served_name, prompt="x", max_tokens=100_000)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=4)


def test_wrong_or_missing_key_gets_401(api, served_name):
    _, _, url = api
    client = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.completions.create(model=served_name, prompt="x", max_tokens=4)
    assert caught.value.body["code"] == "invalid_api_key"
    # No key at all (the openai package will not send a request without one).
    request = urllib.request.Request(
        f"{url}/completions",
        data=json.dumps({"model": served_name, "prompt": "x"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 401
    assert json.loads(caught.value.read())["error"]["code"] == "invalid_api_key"


def test_concurrent_requests_each_equal_generate(api, model, tokenizer, served_name):
    client, _, _ = api
    prompts = [p + suffix for p in PROMPTS for suffix in ("", " and")]  # 8 requests
    expected = [
        generated_text(model, tokenizer, tokenizer(p).input_ids, max_new_tokens=16, do_sample=False)
        for p in prompts
    ]

    def ask(prompt: str) -> str:
        reply = client.completions.create(model=served_name, prompt=prompt, max_tokens=16, temperature=0)
        return reply.choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(ask, prompts)) == expected


def open_sessions(model) -> dict[str, int]:
    return {r.name: r.open_sessions for r in read_peer_records(model.swarm.dht, model.spec.model_id)}


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.25)
    return False


def test_disconnect_mid_stream_frees_the_session_on_every_peer(api, model, served_name):
    client, proc, _ = api
    assert wait_for(lambda: not any(open_sessions(model).values()), 15), open_sessions(model)
    # ignore_eos: the random model's own answer to this prompt ends after ~170 tokens, ~1.5 s,
    # which a slow machine's record updates can miss; 1900 tokens last long enough to be seen.
    stream = client.completions.create(
        model=served_name,
        prompt=PROMPTS[3],
        max_tokens=1900,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    for _ in range(5):
        next(chunks)
    assert wait_for(lambda: sum(open_sessions(model).values()) >= 2, 10), open_sessions(model)  # 2+ hops
    stream.close()
    left = time.monotonic()
    assert wait_for(lambda: not any(open_sessions(model).values()), 15), open_sessions(model)
    assert time.monotonic() - left < 15
    assert wait_for(lambda: "the client left" in proc.log(), 10), proc.log()[-2000:]


def test_uncovered_model_gets_503_naming_the_missing_blocks(swarm, make_model):
    other = make_model(arch="llama", layers=3, seed=5)  # no peer serves it
    proc, url = start_api(swarm, "api-uncovered", other, "--coverage-timeout", "1")
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        wait_until_listening(client)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as caught:
                client.completions.create(model=other.name, prompt="x", max_tokens=4, stream=stream)
            assert caught.value.status_code == 503
            assert caught.value.body["code"] == "missing_blocks"
            assert "0:3" in caught.value.body["message"]
        status, health = get(root(url) + "/health")
        assert status == 503 and health["status"] == "unavailable" and "0:3" in health["reason"]
        assert get(root(url) + "/docs", parse=False)[0] == 200  # no key set: the docs are open
    finally:
        swarm.local.stop(proc)


def root(url: str) -> str:
    return url.removesuffix("/v1")


def get(url: str, key: str | None = None, parse: bool = True) -> tuple[int, dict | bytes]:
    """(status, JSON body) of a GET, errors included."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        status, body = refused.code, refused.read()
    return status, json.loads(body) if parse else body


def test_health_needs_no_key_and_says_the_model_is_covered(api):
    _, _, url = api
    status, health = get(root(url) + "/health")
    assert status == 200 and health["status"] == "ok"
    assert health["generating"] >= 0 and health["queued"] >= 0


def test_with_a_key_the_docs_are_off_and_the_schema_needs_the_key(api):
    _, _, url = api
    assert get(root(url) + "/docs", parse=False)[0] == 404
    assert get(root(url) + "/redoc", parse=False)[0] == 404
    status, body = get(root(url) + "/openapi.json")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, schema = get(root(url) + "/openapi.json", key=API_KEY)
    assert status == 200 and "/v1/completions" in schema["paths"]


def test_tokenizing_a_large_prompt_leaves_the_event_loop_free(api, served_name):
    """A ~1 MB prompt takes the server about a second of CPU to tokenize (then it is refused as
    longer than the context); /health answers within a fraction of that meanwhile."""
    _, _, url = api
    prompt = "A swarm of volunteers serves a model. " * 25_000  # 950 KB, under the 1 MiB limit
    outcome = {}

    def big_request():
        began = time.monotonic()
        outcome["status"] = post_json(f"{url}/completions", {"model": served_name, "prompt": prompt})
        outcome["took"] = time.monotonic() - began

    health_waits = []
    worker = threading.Thread(target=big_request)
    worker.start()
    while worker.is_alive():
        began = time.monotonic()
        get(root(url) + "/health")
        health_waits.append(time.monotonic() - began)
    worker.join()
    assert outcome["status"] == 400  # beyond the model's context, found by tokenizing it
    assert len(health_waits) >= 3 and max(health_waits) < outcome["took"] / 3, (health_waits, outcome)


def post_json(url: str, body: dict, key: str = API_KEY) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code
