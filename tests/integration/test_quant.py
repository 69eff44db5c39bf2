"""Quantized peers on a real swarm: `run-peer --quant int8` beside full-precision peers.

A swarm of its own (a bootstrap and four peers of a 6-block model, each serving every block):
q1 and q2 store their linear layers as int8, f1 and f2 in float32. A client routes only through
the formats it accepts (full precision by default), a chain of int8 peers equals the same model
quantized the same way locally, failover replays onto a peer of the failed one's format, and
verification compares a peer only with peers of its format.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from transformers import StoppingCriteriaList

from tests.integration.conftest import SignalHopPeer, swarm_of

pytestmark = pytest.mark.integration

LAYOUT = {
    "q1": ("0:6", ("--quant", "int8")),
    "q2": ("0:6", ("--quant", "int8")),
    "f1": ("0:6", ()),
    "f2": ("0:6", ()),
}
FORMAT_OF = {"q1": "int8", "q2": "int8", "f1": "none", "f2": "none"}
NEW_TOKENS = 10
KWARGS = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


@pytest.fixture(scope="module")
def quant_swarm(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama")
    with swarm_of(model_dir, tmp_path_factory.mktemp("quant"), LAYOUT) as (local, peers):
        yield local, model_dir, peers


@pytest.fixture(scope="module")
def references(quant_swarm):
    """The model as it is, and quantized to int8 the way a peer quantizes it."""
    from transformers import AutoModelForCausalLM

    from hexswarm.peer.quant import quantize_model

    plain = AutoModelForCausalLM.from_pretrained(quant_swarm[1])
    return {"none": plain, "int8": quantize_model(copy.deepcopy(plain), "int8")}


@pytest.fixture
def connect(quant_swarm):
    from hexswarm.client import DistributedModelForCausalLM

    local, model_dir, _ = quant_swarm
    clients = []

    def make(**kwargs):
        clients.append(
            DistributedModelForCausalLM.from_pretrained(
                model_dir, initial_peers=local.initial_peers, **kwargs
            )
        )
        return clients[-1]

    yield make
    for client in clients:
        client.shutdown()


def prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(seed))


def serving_peer(client) -> str:
    return client.last_route.split("[")[0]


def test_peers_announce_their_format_and_real_bytes_per_block(connect, quant_swarm):
    client = connect()
    records = client.swarm.online_records(client.spec.model_id, client.spec.num_blocks, any_format=True)
    by_name = {r.name: r for r in records}
    assert {name: by_name[name].quant for name in LAYOUT} == FORMAT_OF
    int8, full = by_name["q1"].weight_bytes_per_block, by_name["f1"].weight_bytes_per_block
    assert 0 < int8 < 0.35 * full, (int8, full)


def test_a_default_client_routes_only_through_full_precision_peers(connect, references):
    client = connect()
    for seed in range(3):
        got = client.generate(prompt(seed), **KWARGS)
        assert serving_peer(client) in ("f1", "f2"), client.last_route
        assert torch.equal(got, references["none"].generate(prompt(seed), **KWARGS))


def test_an_int8_chain_equals_the_model_quantized_the_same_way_locally(connect, references):
    client = connect(quant="int8")
    got = client.generate(prompt(1), **KWARGS)
    assert serving_peer(client) in ("q1", "q2"), client.last_route
    assert torch.equal(got, references["int8"].generate(prompt(1), **KWARGS))
    # the int8 model computes other numbers than the model as it is, so a float peer would show
    with torch.inference_mode():
        logits = {name: model(prompt(1)).logits for name, model in references.items()}
    assert not torch.equal(logits["int8"], logits["none"])


def test_a_format_no_peer_serves_is_refused_naming_the_formats_on_offer(connect):
    from hexswarm.client import FormatMismatchError

    client = connect(quant=("nf4",), coverage_timeout=30)
    with pytest.raises(FormatMismatchError, match="int8, none") as error:
        client.generate(prompt(0), max_new_tokens=2)
    assert error.value.offered == ["int8", "none"] and error.value.accepted == ("nf4",)


def test_the_generate_command_says_so_in_one_line(quant_swarm):
    local, model_dir, _ = quant_swarm
    result = subprocess.run(
        [sys.executable, "-m", "hexswarm", "generate", str(model_dir), "--initial-peers", *local.initial_peers,
         "--quant", "nf4", "--max-new-tokens", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "hexswarm generate:" in line]
    assert "served only in weight formats int8, none" in line and "Traceback" not in result.stderr


def test_an_unknown_format_is_a_clear_error_before_anything_connects(quant_swarm):
    from hexswarm.client import DistributedModelForCausalLM

    with pytest.raises(ValueError, match="the formats are none, int8, nf4"):
        DistributedModelForCausalLM.from_pretrained(
            quant_swarm[1],
            initial_peers=["/ip4/127.0.0.1/tcp/1/p2p/QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q"],
            quant="fp8",
        )


def test_verification_compares_a_peer_only_with_peers_of_its_format(connect):
    """Every hop step is recomputed by a witness; an int8 peer checked against a float one would
    be caught out (their outputs differ by far more than float32's tolerance)."""
    client = connect(quant=("none", "int8"), verify=1.0)
    for seed in range(4):
        client.generate(prompt(seed), **KWARGS)
    stats = client.verify_stats
    assert stats.compared > 0 and stats.mismatches == 0 and stats.liars == 0, stats.describe()


def test_failover_replays_onto_a_peer_of_the_same_format_and_stays_exact(connect, quant_swarm, references):
    """The client accepts both formats; whichever peer serves and dies, its spare of the same
    format takes over, so the output is that format's exactly. Runs last: it kills a peer."""
    _, _, peers = quant_swarm
    client = connect(quant=("none", "int8"))
    kill = SignalHopPeer(client, peers, tokens=4, hop=0)
    got = client.generate(prompt(5), **KWARGS, stopping_criteria=StoppingCriteriaList([kill]))
    victim, survivor = kill.victim, serving_peer(client)
    assert victim is not None and survivor != victim, client.last_route
    assert FORMAT_OF[survivor] == FORMAT_OF[victim], (victim, survivor)
    assert torch.equal(got, references[FORMAT_OF[victim]].generate(prompt(5), **KWARGS))


@pytest.mark.slow
def test_a_tensor_parallel_int8_peer_matches_one_rank_within_int8_tolerance(make_model, tmp_path, references):
    """Each rank quantizes its own shard: column-parallel rows keep their scales, row-parallel
    shards get per-shard scales, so TP 2 equals TP 1 within int8's error, not bit for bit."""
    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch="llama")
    layout = {"tp": ("0:6", ("--quant", "int8", "--tp", "2", "--devices", "cpu,cpu"))}
    with swarm_of(model_dir, tmp_path, layout) as (local, _):
        client = DistributedModelForCausalLM.from_pretrained(
            model_dir, initial_peers=local.initial_peers, quant="int8"
        )
        try:
            ids = prompt(2)
            with torch.inference_mode():
                got, expected = client(ids).logits, references["int8"](ids).logits
            scale = float(expected.abs().max())
            assert float((got - expected).abs().max()) <= 0.05 * scale  # a random model's logits are flat:
            # its argmax may flip within that, so the test bounds the logits, not the tokens
        finally:
            client.shutdown()
