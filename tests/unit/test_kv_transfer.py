"""A prompt's keys and values moved from a prefill session to a decode session (PeerCore, no
network): the decode session then equals one that computed the prompt itself, and every bad
KV_PUSH gets a typed error and changes nothing."""

from __future__ import annotations

import pytest
import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.frames import decode, encode
from hexswarm.swarm.wire.protocol import ErrorCode, KvPush, KvTarget, Open, ProtocolError, Step

CPU = torch.device("cpu")
PREFILL_PEER = "QmPrefill"


@pytest.fixture(scope="module")
def spec(make_model):
    return load_model_spec(make_model(arch="llama"))


def make_core(spec, start: int = 0, end: int = 6) -> PeerCore:
    limits = PeerLimits(max_sessions=4, max_length=32, max_batch=2, cache_tokens=256)
    return PeerCore(BlockStack.load(spec, start, end, torch.float32, CPU), spec.model_id, limits)


def opened(core, session: str, start: int = 0, end: int = 6, **kv) -> str:
    core.open(Open(session, core.model_id, start, end, 32, 1, "float32", **kv))
    return session


def run(core, session: str, position: int, hidden: torch.Tensor) -> torch.Tensor:
    live, tensor = core.begin_step(Step(session, position, hidden))
    return core.run_step(live, tensor).hidden


def test_a_decode_session_with_imported_keys_and_values_equals_one_that_prefilled(spec):
    prompt, token = torch.randn(1, 7, spec.hidden_size), torch.randn(1, 1, spec.hidden_size)
    prefill, decode_peer, alone = make_core(spec), make_core(spec), make_core(spec)
    target = KvTarget("QmDecode", "dec", 0, 6)
    run(prefill, opened(prefill, "pre", kv_to=(target,)), 0, prompt)
    opened(decode_peer, "dec", kv_from=(PREFILL_PEER,))
    with pytest.raises(ProtocolError) as waiting:
        run(decode_peer, "dec", 7, token)
    assert waiting.value.code == ErrorCode.BAD_STATE  # not before every layer has arrived
    for first, end in ((0, 4), (4, 6)):  # several layers a push, as a prefill peer sends them
        keys, values = prefill.export_kv(prefill.sessions["pre"], range(first, end))
        push = decode(encode(KvPush("dec", first, keys, values)))  # through the wire format
        decode_peer.import_kv(push, PREFILL_PEER)
    run(alone, opened(alone, "s"), 0, prompt)
    assert torch.equal(run(decode_peer, "dec", 7, token), run(alone, "s", 7, token))


@pytest.fixture
def receiver(spec):
    core = make_core(spec)
    opened(core, "dec", kv_from=(PREFILL_PEER,))
    return core


def kv(spec, tokens: int = 5, batch: int = 1, dtype=torch.float32, fill: float = 0.5, layers: int = 1):
    config = spec.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return torch.full((layers, batch, config.num_key_value_heads, tokens, head_dim), fill, dtype=dtype)


@pytest.mark.parametrize(
    "change,code",
    [
        (dict(sender="QmStranger"), ErrorCode.UNKNOWN_SESSION),  # not the session's prefill peer
        (dict(session="nobody"), ErrorCode.UNKNOWN_SESSION),
        (dict(layer=6), ErrorCode.WRONG_LAYERS),
        (dict(layer=4, layers=3), ErrorCode.WRONG_LAYERS),  # runs past the session's last layer
        (dict(tokens=33), ErrorCode.TOO_LONG),  # beyond the session's reserved cache
        (dict(batch=2), ErrorCode.BAD_TENSOR),
        (dict(dtype=torch.float16), ErrorCode.BAD_TENSOR),
        (dict(fill=float("nan")), ErrorCode.BAD_TENSOR),
        (dict(fill=3e4), ErrorCode.BAD_TENSOR),  # finite, but no real model's keys are that large
    ],
)
def test_a_bad_kv_push_is_refused_with_a_typed_error_and_changes_nothing(spec, receiver, change, code):
    sender = change.pop("sender", PREFILL_PEER)
    session, layer = change.pop("session", "dec"), change.pop("layer", 0)
    tensor = kv(spec, **change)
    with pytest.raises(ProtocolError) as error:
        receiver.import_kv(KvPush(session, layer, tensor, tensor), sender)
    assert error.value.code == code
    assert receiver.sessions["dec"].kv_imported == {} and receiver.sessions["dec"].position == 0


def test_layers_of_one_prompt_must_agree_and_arrive_once(spec, receiver):
    receiver.import_kv(KvPush("dec", 0, kv(spec), kv(spec)), PREFILL_PEER)
    for layer, tokens, layers in ((0, 5, 1), (1, 6, 1), (0, 5, 2)):  # again; another length; again in part
        with pytest.raises(ProtocolError):
            receiver.import_kv(
                KvPush("dec", layer, kv(spec, tokens, layers=layers), kv(spec, tokens, layers=layers)),
                PREFILL_PEER,
            )
    assert receiver.sessions["dec"].kv_imported == {0: 5}


def test_open_refuses_keys_and_values_outside_the_session_or_both_ways(spec):
    core = make_core(spec, 2, 5)
    with pytest.raises(ProtocolError) as outside:
        opened(core, "a", 2, 5, kv_to=(KvTarget("QmD", "d", 1, 4),))
    with pytest.raises(ProtocolError) as both:
        opened(core, "b", 2, 5, kv_to=(KvTarget("QmD", "d", 2, 4),), kv_from=("QmP",))
    assert (outside.value.code, both.value.code) == (ErrorCode.WRONG_LAYERS, ErrorCode.BAD_STATE)


@pytest.mark.parametrize(
    "body",
    [
        {"kv_from": ["x" * 200]},
        {"kv_from": ["QmP"] * 65},
        {"kv_to": [["QmD", "d", 4, 2]]},
        {"kv_to": [["QmD", "d", 0]]},
        {"kv_to": [["QmD", "d", True, 2]]},
    ],
)
def test_malformed_kv_fields_of_an_open_are_refused(body):
    import msgpack

    frame = msgpack.unpackb(encode(Open("s", "m", 0, 2, 8, 1, "float32")))
    frame.update(body)
    with pytest.raises(ProtocolError) as error:
        decode(msgpack.packb(frame))
    assert error.value.code == ErrorCode.MALFORMED


def test_a_push_of_another_length_than_the_clients_prompt_is_refused(spec):
    core = make_core(spec)
    opened(core, "dec", kv_from=(PREFILL_PEER,), prompt_length=7)
    with pytest.raises(ProtocolError) as error:  # a short cache: the prompt's end left out
        core.import_kv(KvPush("dec", 0, kv(spec, tokens=5), kv(spec, tokens=5)), PREFILL_PEER)
    assert error.value.code == ErrorCode.BAD_TENSOR and "the client's prompt has 7" in error.value.message
    core.import_kv(KvPush("dec", 0, kv(spec, tokens=7), kv(spec, tokens=7)), PREFILL_PEER)
    assert core.sessions["dec"].kv_imported == {0: 7}
    with pytest.raises(ProtocolError):  # a prompt length is a decode session's, within its length
        opened(core, "other", prompt_length=7)
