"""SmolLM2-135M-Instruct (the `smollm2-135m` built-in GGUF) served by real swarms on 127.0.0.1.

Every figure is checked against the same GGUF file loaded locally by transformers' own GGUF
reader (not through hexswarm's cached checkpoint), so the cache's de-quantization is checked too.
Each layout is a class with its own swarm, stopped before the next one starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from hexswarm.swarm.models.builtin_models import BUILTIN_MODELS, DEFAULT_MODEL, builtin_path
from hexswarm.swarm.tools.launcher import LocalSwarm, free_port
from hexswarm.swarm.trust.records import read_peer_records
from tests.integration.browser import requires_chromium, start_browser, wait_for
from tests.integration.test_coordinator import wait_until

pytestmark = pytest.mark.integration

GGUF = builtin_path(BUILTIN_MODELS[DEFAULT_MODEL])
if GGUF is None:
    pytest.skip(
        f"{BUILTIN_MODELS[DEFAULT_MODEL].install_command} to run these tests", allow_module_level=True
    )

PARAGRAPH = (
    Path(__file__).parents[1] / "data" / "two_cities.txt"
).read_text()  # Dickens, 1859: public domain
UNREACHABLE = ("--initial-peers", "/ip4/127.0.0.1/tcp/9/p2p/QmUnreachable")  # never contacted


@pytest.fixture(scope="module")
def reference():
    """The model and tokenizer as transformers itself reads the GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    return model.eval(), AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)


def start_swarm(tmp_path_factory, layout: dict[str, tuple[str, tuple[str, ...]]]):
    local = LocalSwarm(tmp_path_factory.mktemp("real-swarm"))
    try:
        local.start_bootstrap()
        local.start_peers(DEFAULT_MODEL, layout, "--announce-period", "1", timeout=240)
    except BaseException:
        local.close()
        raise
    return local


def client_of(local: LocalSwarm):
    from hexswarm.client import DistributedModelForCausalLM

    return DistributedModelForCausalLM.from_pretrained(DEFAULT_MODEL, initial_peers=local.initial_peers)


def greedy_matches(model, reference, prompt: str, new_tokens: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    local, tokenizer = reference
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = local.generate(
        input_ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens
    )
    got = model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    return got, expected


@pytest.fixture(scope="class")
def two_peers(tmp_path_factory):
    local = start_swarm(tmp_path_factory, {"left": ("0:11", ()), "right": ("11:30", ())})
    yield local
    local.close()


@pytest.fixture(scope="class")
def three_peers(tmp_path_factory):
    local = start_swarm(tmp_path_factory, {"one": ("0:10", ()), "two": ("10:20", ()), "three": ("20:30", ())})
    yield local
    local.close()


@pytest.fixture(scope="class")
def tp3_peer(tmp_path_factory):
    layout = {"tp3": ("0:30", ("--tp", "3", "--devices", "cpu,cpu,cpu", "--tp-timeout", "30"))}
    local = start_swarm(tmp_path_factory, layout)
    yield local
    local.close()


@pytest.fixture(scope="class")
def two_peer_model(two_peers):
    model = client_of(two_peers)
    yield model
    model.shutdown()


class TestTwoUnevenPeers:
    def test_greedy_32_tokens_equal_local_and_logits_match(self, two_peer_model, reference):
        got, expected = greedy_matches(two_peer_model, reference, "The capital of France is")
        assert torch.equal(got, expected)
        assert "left[0:11)" in two_peer_model.last_route and "right[11:30)" in two_peer_model.last_route
        with torch.no_grad():
            torch.testing.assert_close(
                two_peer_model(expected).logits, reference[0](expected).logits, atol=1e-4, rtol=1e-4
            )

    def test_perplexity_of_a_paragraph_equals_local(self, two_peer_model, reference):
        local, tokenizer = reference
        input_ids = tokenizer(PARAGRAPH, return_tensors="pt").input_ids
        assert input_ids.shape[1] >= 300
        with torch.no_grad():
            swarm_ppl = perplexity(two_peer_model(input_ids).logits, input_ids)
            local_ppl = perplexity(local(input_ids).logits, input_ids)
        assert abs(swarm_ppl - local_ppl) <= 1e-4 * local_ppl, (swarm_ppl, local_ppl)
        assert swarm_ppl < 100  # a trained model (35 here); random weights give ~49,000

    def test_api_chat_answer_equals_local_chat_template(self, two_peers, reference):
        local, tokenizer = reference
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")[
            "input_ids"
        ]
        expected = local.generate(ids, max_new_tokens=32, do_sample=False)
        expected_text = tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
        port = free_port()
        api = two_peers.start_command(
            "api",
            [sys.executable, "-m", "hexswarm.swarm.commands.cli", "api", "--model", DEFAULT_MODEL, "--port", str(port),
             "--initial-peers", *two_peers.initial_peers],
            ready="api: serving",
            timeout=180,
        )  # fmt: skip
        try:
            body = {"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}
            answer = post_json(f"http://127.0.0.1:{port}/v1/chat/completions", body)
            began = time.monotonic()
            with pytest.raises(urllib.error.HTTPError) as refused:  # the peers' --max-length is 2048
                post_json(f"http://127.0.0.1:{port}/v1/chat/completions", {**body, "max_tokens": 2100})
            waited = time.monotonic() - began
        finally:
            two_peers.stop(api)
        assert refused.value.code == 400 and waited < 5, waited
        assert "accept at most 2048 tokens" in json.loads(refused.value.read())["error"]["message"]
        assert "-> 400 a sequence of" in api.log()  # every refusal is in the API's log
        assert "[ERROR]" not in api.log()  # a clean stop says nothing alarming (no daemon errors)
        assert answer["choices"][0]["message"]["content"] == expected_text
        assert "Paris" in expected_text

    def test_a_client_of_another_gguf_is_told_both_model_ids(
        self, two_peers, two_peer_model, tmp_path, monkeypatch
    ):
        from hexswarm.client import DistributedModelForCausalLM, ModelMismatchError

        other = tmp_path / "SmolLM2-other.gguf"
        data = bytearray(GGUF.read_bytes())
        data[len(data) // 2] ^= 1  # one bit of one weight: another file, another model id
        other.write_bytes(bytes(data))
        monkeypatch.setenv("HEXSWARM_MODEL_CACHE", str(tmp_path / "cache"))
        client = DistributedModelForCausalLM.from_pretrained(other, initial_peers=two_peers.initial_peers)
        try:
            with pytest.raises(ModelMismatchError) as caught:
                client.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2)
        finally:
            client.shutdown()
        assert two_peer_model.spec.model_id in str(caught.value) and client.spec.model_id in str(caught.value)
        assert two_peer_model.spec.model_id != client.spec.model_id

    # The chat page `hexswarm api` serves, in headless Chromium at a phone's width (issue 52).
    @requires_chromium
    def test_chat_page_streams_an_answer_with_its_chain_and_a_second_turn_sees_the_first(self, chat_page):
        index = ask(chat_page, "What is the capital of France?")
        answer, seen = answer_when_done(chat_page, index, 120)
        assert answer["state"] == "done" and "Paris" in answer["text"], answer
        assert len(seen) >= 2, seen  # the text grew while it streamed, not all at once
        assert "left[0:11)" in answer["route"] and "right[11:30)" in answer["route"], answer
        assert "first token after" in answer["served"] and "tokens/s" in answer["served"], answer
        index = ask(chat_page, "And of Italy?")
        second, _ = answer_when_done(chat_page, index, 120)
        assert second["state"] == "done" and second["sent"] == "3", second  # user, assistant, user

    @requires_chromium
    def test_chat_page_stop_ends_a_long_answer_and_frees_every_peers_session(self, chat_page, two_peer_model):
        from selenium.webdriver.common.by import By

        set_number(chat_page, "max-tokens", 1000)
        index = ask(chat_page, "Write a long story about a dragon who learns to cook.")
        wait_for(lambda: answer_at(chat_page, index)["chunks"] >= 3, 60, "three chunks of the answer")
        wait_for(lambda: sum(open_sessions(two_peer_model).values()) >= 2, 30, "a session on each peer")
        chat_page.find_element(By.ID, "stop").click()
        wait_for(lambda: answer_at(chat_page, index)["state"] == "stopped", 10, "the page to stop")
        wait_for(lambda: not any(open_sessions(two_peer_model).values()), 20, "every session closed")
        set_number(chat_page, "max-tokens", 256)

    @requires_chromium
    def test_chat_page_shows_markup_in_an_answer_as_text(self, chat_page):
        from selenium.common.exceptions import NoAlertPresentException

        chat_page.find_element("id", "new-chat").click()
        set_number(chat_page, "max-tokens", 100)
        # SmolLM2's greedy answer has a <script> with alert() and an <img onerror="alert(...)">
        index = ask(chat_page, "Show an XSS example in HTML using <script> and <img onerror>.")
        answer, _ = answer_when_done(chat_page, index, 120)
        set_number(chat_page, "max-tokens", 256)
        assert answer["state"] == "done", answer
        assert "<script>" in answer["text"] and "<img" in answer["text"] and "onerror=" in answer["text"], (
            answer
        )
        assert (
            chat_page.execute_script("return document.querySelectorAll('#turns img, #turns script').length")
            == 0
        )
        with pytest.raises(NoAlertPresentException):  # no handler of the answer ran
            _ = chat_page.switch_to.alert.text

    @requires_chromium
    def test_chat_page_says_in_words_when_blocks_have_no_peer(self, chat_page, two_peers):
        # The class's last test: it stops the swarm's only peer of blocks 11:30.
        two_peers.stop(next(p for p in two_peers.processes if p.name == "right"))
        index = ask(chat_page, "What is the capital of Spain?")
        answer, _ = answer_when_done(chat_page, index, 90)
        assert answer["state"] == "error", answer
        assert "no online peer serves blocks 11:30" in answer["problem"], answer
        assert "Start a peer for those blocks" in answer["problem"], answer
        wait_for(
            lambda: "11:30" in chat_page.find_element("id", "health").text, 30, "the header's coverage line"
        )


CHAT_KEY = "chat-page-test-key"
TURNS_JS = """
return [...document.querySelectorAll("#turns .turn")].map(t => ({
    role: t.dataset.role, state: t.dataset.state || "", text: t.querySelector(".bubble").textContent,
    route: t.dataset.route || "", sent: t.dataset.sentMessages || "", chunks: Number(t.dataset.chunks || 0),
    served: (t.querySelector(".served") || {}).textContent || "",
    problem: (t.querySelector(".problem") || {}).textContent || ""}));
"""


@pytest.fixture(scope="class")
def chat_page(two_peers):
    """`hexswarm api` with a key, and its chat page open in headless Chromium, the key entered."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    port = free_port()
    api = two_peers.start_command(
        "chat-api",
        [sys.executable, "-m", "hexswarm.swarm.commands.cli", "api", "--model", DEFAULT_MODEL, "--port", str(port),
         "--initial-peers", *two_peers.initial_peers, "--api-key", CHAT_KEY],
        ready="api: serving",
        timeout=180,
    )  # fmt: skip
    browser = start_browser(width=420, height=900)  # a phone's width
    try:
        browser.get(f"http://127.0.0.1:{port}/")
        wait_for(
            lambda: browser.find_element(By.ID, "key-form").is_displayed(), 30, "the page to ask for the key"
        )
        browser.find_element(By.ID, "api-key").send_keys(CHAT_KEY + Keys.ENTER)
        wait_for(lambda: browser.find_element(By.ID, "model").text == DEFAULT_MODEL, 30, "the model's name")
        assert browser.execute_script("return sessionStorage.getItem('hexswarm-api-key')") == CHAT_KEY
        assert CHAT_KEY not in browser.current_url
        yield browser
    finally:
        browser.quit()
        two_peers.stop(api)


def ask(browser, text: str) -> int:
    """Types `text` into the page's input and sends it with Enter, as a person does; returns the
    index of the answer's turn on the page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    shown = len(browser.execute_script(TURNS_JS))
    browser.find_element(By.ID, "input").send_keys(text + Keys.ENTER)
    wait_for(
        lambda: len(browser.execute_script(TURNS_JS)) >= shown + 2, 10, "the question and its answer's place"
    )
    return shown + 1


def answer_at(browser, index: int) -> dict:
    return browser.execute_script(TURNS_JS)[index]


def answer_when_done(browser, index: int, timeout: float) -> tuple[dict, list[str]]:
    """The answer at `index` once it ended, and each distinct text it showed while it streamed."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = answer_at(browser, index)
        if answer["state"] == "streaming" and answer["text"] and (not seen or seen[-1] != answer["text"]):
            seen.append(answer["text"])
        if answer["state"] != "streaming":
            return answer, seen
        time.sleep(0.05)
    raise AssertionError(f"the answer did not end within {timeout} s: {answer_at(browser, index)}")


def open_sessions(model) -> dict[str, int]:
    return {r.name: r.open_sessions for r in read_peer_records(model.swarm.dht, model.spec.model_id)}


def set_number(browser, element_id: str, value: int) -> None:
    browser.execute_script(f"document.getElementById('{element_id}').value = arguments[0]", value)


class TestThreePeers:
    def test_greedy_32_tokens_equal_local(self, three_peers, reference):
        model = client_of(three_peers)
        try:
            got, expected = greedy_matches(model, reference, "A swarm of volunteers")
            assert torch.equal(got, expected)
            assert all(f"{name}[" in model.last_route for name in ("one", "two", "three")), model.last_route
        finally:
            model.shutdown()


@pytest.mark.slow
class TestTensorParallel:
    """A TP-3 peer splits SmolLM2's 3 KV heads one per rank (gloo on CPU)."""

    def test_tp3_matches_tp1_within_float_tolerance(self, tp3_peer, reference):
        model = client_of(tp3_peer)
        try:
            got, expected = greedy_matches(model, reference, "The capital of France is", new_tokens=16)
            assert torch.equal(got, expected)
            assert "tp3[0:30)" in model.last_route
            with torch.no_grad():
                logits = model(expected).logits
            torch.testing.assert_close(logits, reference[0](expected).logits, atol=1e-3, rtol=1e-3)
        finally:
            model.shutdown()


def perplexity(logits: torch.Tensor, input_ids: torch.Tensor) -> float:
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].double(), input_ids[0, 1:])
    return float(torch.exp(loss))


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


# --- bad input: a one-line reason and exit status 2, before any network starts ---


def run_peer(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hexswarm.peer.cli", *args, *UNREACHABLE],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def assert_usage_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("run-peer:")]
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_layers_past_the_models_30_exit_2():
    assert_usage_error(run_peer(DEFAULT_MODEL, "--layers", "20:31"), "--layers 20:31 is not inside 0:30")


def test_truncated_gguf_exits_2(tmp_path):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(GGUF.read_bytes()[: GGUF.stat().st_size // 2])
    env = {**os.environ, "HEXSWARM_MODEL_CACHE": str(tmp_path / "cache")}
    assert_usage_error(run_peer(str(truncated), "--layers", "0:4", env=env), "cannot read it as a GGUF")


def test_gguf_of_an_unsupported_architecture_exits_2(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_name("tiny-gpt2")
    for add, value in (
        (writer.add_context_length, 64),
        (writer.add_embedding_length, 8),
        (writer.add_block_count, 1),
        (writer.add_feed_forward_length, 16),
        (writer.add_head_count, 2),
    ):
        add(value)  # fmt: skip
    writer.add_layer_norm_eps(1e-5)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    env = {**os.environ, "HEXSWARM_MODEL_CACHE": str(tmp_path / "cache")}
    assert_usage_error(run_peer(str(path), "--layers", "0:1", env=env), "model type 'gpt2'")


@pytest.fixture(scope="class")
def coordinated(tmp_path_factory):
    from hexswarm.swarm.models.model_spec import model_identity
    from hexswarm.swarm.net.dht import start_dht
    from hexswarm.swarm.net.dht_process import shutdown_dht
    from hexswarm.swarm.tools.launcher import LOOPBACK

    layout = {f"auto{i}": ("auto", ("--max-blocks", "15")) for i in range(3)}  # default flags otherwise
    local = start_swarm(tmp_path_factory, layout)
    try:
        coordinator = [sys.executable, "-m", "hexswarm.swarm.commands.cli", "coordinator", "--initial-peers", *local.initial_peers,
                       "--model", DEFAULT_MODEL, "--host-maddrs", LOOPBACK]  # fmt: skip
        local.start_command("coordinator", coordinator, ready="coordinator candidate", timeout=120)
        dht = start_dht(local.initial_peers, None, host_maddrs=[LOOPBACK], client_mode=True)
        yield local, dht, model_identity(DEFAULT_MODEL)[0]
        shutdown_dht(dht, 5)
    finally:
        local.close()


class TestCoordinatorKeepsTheModelCovered:
    """The swarm a new user ran: three `--layers auto --max-blocks 15` peers of SmolLM2's 30 blocks and a
    coordinator with its default flags; the sole server of a range leaves with SIGTERM."""

    def test_the_swarm_is_covered_again_within_10_s_and_exact(self, coordinated, reference):
        from hexswarm.swarm.coordinator.records import read_coordination_sync
        from hexswarm.swarm.trust.records import PeerState, online_peers_per_block, read_peer_records

        local, dht, model_id = coordinated

        def online():
            return [r for r in read_peer_records(dht, model_id) if r.state == PeerState.ONLINE]

        def followed_and_covered():
            plan, records = read_coordination_sync(dht, model_id).plan, online()
            if plan is None or len(records) != 3 or any(r.plan_version != plan.version for r in records):
                return None
            return records if all(online_peers_per_block(records, 30)) else None

        records = wait_until(followed_and_covered, 240, "a first plan that every peer follows")
        counts = online_peers_per_block(records, 30)
        sole = next(r for r in records if any(counts[b] == 1 for b in range(r.start, r.end)))
        local.stop(next(p for p in local.processes if p.name == sole.name))  # SIGTERM: a clean leave
        left = time.monotonic()
        wait_until(lambda: sole.peer_id not in {r.peer_id for r in online()} and all(online_peers_per_block(online(), 30)), 60,
                 f"blocks {sole.start}:{sole.end} served again after {sole.name} left", period=0.2)  # fmt: skip
        took = time.monotonic() - left
        print(f"blocks {sole.start}:{sole.end} served again {took:.1f} s after {sole.name} left")
        # The coordinator sees the leave within 1 s and re-plans at once; the peers read the plan
        # within 1 s and load 15 blocks (docs/scheduling.md "The coordinator")
        assert took <= 10
        plan = read_coordination_sync(dht, model_id).plan
        assert plan.missing == () and plan.attainment > 0  # the deadline fits this CPU swarm
        model = client_of(local)
        try:
            got, expected = greedy_matches(model, reference, "The capital of France is", new_tokens=16)
            assert torch.equal(got, expected)
        finally:
            model.shutdown()
