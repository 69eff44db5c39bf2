"""A volunteer that announces values no honest peer would (NaN throughput, negative counts) is
dropped alone: every router keeps working for every client, and generation stays exact."""

import pytest
import torch

from hexswarm.swarm.net.dht_read import get_many_latest
from hexswarm.swarm.trust.record_keys import record_keys
from hexswarm.swarm.trust.records import parse_signed_entries, read_peer_records

pytestmark = pytest.mark.integration

HOSTILE_FIELDS = ("throughput=NaN", "open_sessions=-1", "decode_ms_per_block=-5.0")


@pytest.fixture(scope="module")
def liar(shared_swarm):
    """A real peer serving every block, whose signed record carries out-of-range values."""
    flags = [arg for field in HOSTILE_FIELDS for arg in ("--debug-record", field)]
    proc = shared_swarm.local.start_peer(
        shared_swarm.model_dir, "0:6", "liar", "--announce-period", "1", *flags
    )
    yield proc
    shared_swarm.local.stop(proc)


def test_the_hostile_record_is_in_the_dht_but_no_reader_takes_it(model, liar):
    values = get_many_latest(model.swarm.dht, record_keys(model.spec.model_id))
    signed_by = {
        owner for raw in values.values() for owner, _ in parse_signed_entries(raw, lambda value: value)
    }
    names = {r.name for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
    assert len(signed_by) > len(names)  # the liar's entry is there, correctly signed ...
    assert "liar" not in names and {"p1", "p2", "p3"} <= names  # ... and only it is dropped


@pytest.mark.parametrize("routing", ["min_latency", "tradeoff", "max_throughput"])
def test_every_router_still_serves_exactly(swarm, local_model, liar, routing):
    from hexswarm.client import DistributedModelForCausalLM

    client = DistributedModelForCausalLM.from_pretrained(
        swarm.model_dir, initial_peers=swarm.initial_peers, coverage_timeout=60, routing=routing
    )
    try:
        input_ids = torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(5))
        expected = local_model.generate(input_ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(client.generate(input_ids, max_new_tokens=8, do_sample=False), expected)
    finally:
        client.shutdown()
