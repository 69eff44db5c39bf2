"""A peer's blocks and sessions without the network: exactness per architecture, and limits."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.protocol import Close, ErrorCode, Open, ProtocolError, Step

CPU = torch.device("cpu")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_chain_of_sub_ranges_equals_full_model(make_model, arch):
    """Blocks split over hops, prefill then decode steps, match the full model's hidden states."""
    model_dir = make_model(arch=arch, max_shard_size="200KB" if arch == "qwen2" else None)
    spec = load_model_spec(model_dir)
    full = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = torch.randint(3, 300, (2, 9))
    with torch.no_grad():
        expected = full(ids, output_hidden_states=True).hidden_states[-1]
    # Two stacks; the second is used for a sub-range only, as a router may do.
    stacks = [
        BlockStack.load(spec, 0, 4, torch.float32, CPU),
        BlockStack.load(spec, 2, 6, torch.float32, CPU),
    ]
    hops = [(stacks[0], 0, 3), (stacks[1], 3, 6)]
    caches = [stack.new_cache("s") for stack, _, _ in hops]
    embeds = full.model.embed_tokens(ids)
    outputs = []
    for a, b in [(0, 6), (6, 7), (7, 8), (8, 9)]:
        hidden = embeds[:, a:b]
        for (stack, start, end), cache in zip(hops, caches, strict=True):
            hidden = stack(hidden, cache, a, start, end)
        outputs.append(hidden)
    got = full.model.norm(torch.cat(outputs, dim=1))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.fixture
def core(make_model):
    spec = load_model_spec(make_model(arch="llama"))
    blocks = BlockStack.load(spec, 2, 5, torch.float32, CPU)
    limits = PeerLimits(max_sessions=2, max_length=16, max_batch=2, cache_tokens=40, session_idle_timeout=1.0)
    return PeerCore(blocks, spec.model_id, limits)


def _open(core, session="s1", start=2, end=5, max_length=16, batch=1, dtype="float32", model=None):
    return core.open(Open(session, model or core.model_id, start, end, max_length, batch, dtype))


def _step(core, session="s1", position=0, hidden=None):
    hidden = torch.randn(1, 3, 128) if hidden is None else hidden
    live, tensor = core.begin_step(Step(session, position, hidden))
    return core.run_step(live, tensor)


def _code(fn):
    with pytest.raises(ProtocolError) as error:
        fn()
    return error.value.code


def test_open_refusals(core):
    assert _code(lambda: _open(core, model="other-model")) == ErrorCode.WRONG_MODEL
    assert _code(lambda: _open(core, start=0, end=3)) == ErrorCode.WRONG_LAYERS
    assert _code(lambda: _open(core, end=6)) == ErrorCode.WRONG_LAYERS
    assert _code(lambda: _open(core, max_length=17)) == ErrorCode.TOO_LONG
    assert _code(lambda: _open(core, batch=3)) == ErrorCode.BUSY
    assert _code(lambda: _open(core, dtype="int8")) == ErrorCode.BAD_TENSOR
    _open(core, "a")
    assert _code(lambda: _open(core, "a")) == ErrorCode.BAD_STATE
    _open(core, "b")
    assert _code(lambda: _open(core, "c")) == ErrorCode.BUSY  # session limit
    core.leaving = True
    core.drop("a")
    assert _code(lambda: _open(core, "d")) == ErrorCode.LEAVING


def test_cache_budget(core):
    _open(core, "a", max_length=16, batch=2)  # reserves 32 of 40 tokens
    assert core.cache_tokens_left == 8
    assert _code(lambda: _open(core, "b", max_length=16)) == ErrorCode.BUSY
    core.close(Close("a"))
    assert core.cache_tokens_left == 40


def test_step_refusals_leave_the_session_usable(core):
    _open(core)
    assert _code(lambda: _step(core, session="nope")) == ErrorCode.UNKNOWN_SESSION
    assert _code(lambda: _step(core, hidden=torch.randn(1, 3, 64))) == ErrorCode.BAD_TENSOR
    assert _code(lambda: _step(core, hidden=torch.randn(2, 3, 128))) == ErrorCode.BAD_TENSOR
    assert _code(lambda: _step(core, hidden=torch.randn(3, 128))) == ErrorCode.BAD_TENSOR
    assert _code(lambda: _step(core, hidden=torch.randn(1, 3, 128).half())) == ErrorCode.BAD_TENSOR
    assert _code(lambda: _step(core, hidden=torch.full((1, 3, 128), float("nan")))) == ErrorCode.BAD_TENSOR
    assert _code(lambda: _step(core, position=4)) == ErrorCode.BAD_STATE
    assert _code(lambda: _step(core, hidden=torch.randn(1, 17, 128))) == ErrorCode.TOO_LONG
    result = _step(core)
    assert result.hidden.shape == (1, 3, 128)
    assert core.sessions["s1"].position == 3


def test_idle_sessions_are_freed(core):
    _open(core)
    assert core.expire_idle(now=core.sessions["s1"].last_used + 0.5) == []
    assert core.expire_idle(now=core.sessions["s1"].last_used + 2.0) == ["s1"]
    assert core.sessions == {} and core.cache_tokens_left == 40


def test_a_failed_peer_answers_peer_failed_but_lets_sessions_close(core):
    _open(core, "a")
    _step(core, "a")
    core.fail("tensor-parallel rank 1 was killed by SIGKILL")
    assert _code(lambda: _step(core, "a", position=3)) == ErrorCode.PEER_FAILED
    assert _code(lambda: _open(core, "b")) == ErrorCode.PEER_FAILED
    core.close(Close("a"))  # the client closes after hearing the error; its cache is freed
    assert not core.sessions


def test_one_session_reserves_at_most_its_share_of_the_cache(core):
    from dataclasses import replace

    core.limits = replace(core.limits, session_cache_tokens=16)
    assert core.session_cache_tokens_left == 16
    with pytest.raises(ProtocolError) as refused:
        _open(core, "big", batch=2, max_length=16)  # 32 tokens: over one session's 16
    assert refused.value.code == ErrorCode.BUSY and "one session may reserve 16" in refused.value.message
    _open(core, "fits", batch=1, max_length=16)
    assert core.session_cache_tokens_left == 16 and core.cache_tokens_left == 24


def test_a_step_below_the_cached_length_rolls_the_cache_back(core):
    """Speculative steps: a step that starts below what the session holds drops the tokens after
    it first (drafts the client rejected), and its output equals a session that never saw them."""
    torch.manual_seed(0)
    accepted, rejected, after = torch.randn(1, 6, 128), torch.randn(1, 4, 128), torch.randn(1, 2, 128)
    _open(core, "spec")
    _open(core, "plain")
    _step(core, "spec", 0, accepted)
    _step(core, "spec", 6, rejected)  # drafted, then rejected from its second token on
    _step(core, "plain", 0, torch.cat([accepted, rejected[:, :1]], dim=1))
    assert _code(lambda: _step(core, "spec", 11, after)) == ErrorCode.BAD_STATE  # past its length
    rolled = _step(core, "spec", 7, after).hidden
    torch.testing.assert_close(rolled, _step(core, "plain", 7, after).hidden)
    assert core.sessions["spec"].position == 9
    # a one-token step rolled back runs through the batched decode path
    one = torch.randn(1, 1, 128)
    live = [core.begin_step(Step(s, p, one)) for s, p in [("spec", 8), ("plain", 8)]]
    first, second = core.run_decode_batch(live)
    torch.testing.assert_close(first.hidden, second.hidden)
    assert [core.sessions[s].position for s in ("spec", "plain")] == [9, 9]


def test_a_roll_back_is_refused_where_the_cache_cannot_forget(core):
    _open(core)
    _step(core)
    core.blocks.config.sliding_window = 4  # a window has forgotten what a roll-back needs
    try:
        assert _code(lambda: _step(core, position=1)) == ErrorCode.BAD_STATE
    finally:
        core.blocks.config.sliding_window = None
    assert core.sessions["s1"].position == 3 and not core.sessions["s1"].busy
