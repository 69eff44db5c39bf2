"""`run-peer --tp 3 --partition auto` (Hepti's uneven split) in a real swarm on 127.0.0.1.

A chain of a three-rank group with an uneven split (8 heads, 4 KV heads: no even split of three
exists) and a one-process peer. One rank of the group slows down mid-generation; the group
re-partitions while the client's session is open, and the output stays equal to the local
model's, token for token.
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM, StoppingCriteria

from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHAPE = dict(arch="llama", layers=4, hidden=128, heads=8, kv_heads=4)
UNREACHABLE = ("--initial-peers", "/ip4/127.0.0.1/tcp/9/p2p/QmUnreachable")  # never contacted
DEADLINE_S = 90


class StopAfterRepartition(StoppingCriteria):
    """Keeps generating until the group's record shows a re-partition, then `extra` tokens more
    (or until the deadline: the test then fails on the record)."""

    def __init__(self, model, extra: int = 12):
        self.model, self.extra = model, extra
        self.switched_at: int | None = None
        self.began = time.monotonic()

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        length = input_ids.shape[1]
        if self.switched_at is None and length % 8 == 0 and self._repartitioned():
            self.switched_at = length
        if self.switched_at is not None:
            return length >= self.switched_at + self.extra
        return time.monotonic() - self.began > DEADLINE_S

    def _repartitioned(self) -> bool:
        records = read_peer_records(self.model.swarm.dht, self.model.spec.model_id)
        return any(r.tp_repartitions for r in records)


def test_an_uneven_group_re_splits_mid_generation_and_stays_exact(make_model, tmp_path):
    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(**SHAPE)
    with LocalSwarm(tmp_path) as local:
        local.start_bootstrap()
        group = local.start_peer(
            model_dir, "0:3", "hepti", "--tp", "3", "--devices", "cpu,cpu,cpu", "--partition", "auto",
            "--debug-slowdown", "2:4@1.5", "--throughput", "100", "--decode-ms", "1", "--announce-period", "1",
            wait=False,
        )  # fmt: skip
        single = local.start_peer(model_dir, "3:4", "single", "--announce-period", "1", wait=False)
        for proc in (group, single):
            local.wait_for_log(proc, "online:", timeout=180)
        assert "Hepti split (weight-stationary)" in group.log()
        model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers)
        reference = AutoModelForCausalLM.from_pretrained(model_dir)
        try:
            input_ids = torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(3))
            with torch.no_grad():  # the uneven split equals TP 1 within float tolerance
                torch.testing.assert_close(
                    model(input_ids).logits, reference(input_ids).logits, atol=1e-4, rtol=1e-4
                )
            stop = StopAfterRepartition(model)
            output = model.generate(input_ids, max_new_tokens=1500, do_sample=False, stopping_criteria=[stop])
            assert stop.switched_at is not None, (
                "no re-partition within the deadline:\n" + group.log()[-3000:]
            )
            new_tokens = output.shape[1] - input_ids.shape[1]
            expected = reference.generate(input_ids, max_new_tokens=new_tokens, do_sample=False)
            assert torch.equal(output, expected)
            assert not model.last_failovers  # the session lived through the switch
            assert "hepti[" in model.last_route and "single[" in model.last_route
            (record,) = [
                r for r in read_peer_records(model.swarm.dht, model.spec.model_id) if r.name == "hepti"
            ]
        finally:
            model.shutdown()
    assert record.tp_partition == "weight-stationary" and record.tp_repartitions >= 1
    heads, columns = zip(*record.tp_shares, strict=True)
    assert sum(heads) == 8 and min(heads) >= 2 and min(columns) >= 1
    assert record.tp_predicted_step_ms > 0 and record.tp_observed_step_ms > 0
    assert "re-partitioned in" in group.log()


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ("--tp", "5", "--devices", "cpu,cpu,cpu,cpu,cpu"),
            "the model's 4 KV heads cannot give every rank one",
        ),
        (("--tp", "1"), "--partition auto splits a group of at least 2 ranks"),
        (("--tp", "3", "--devices", "cpu,cpu,cpu", "--debug-slowdown", "1:0.5"), "--debug-slowdown needs"),
    ],
)
def test_bad_uneven_groups_exit_2_before_loading(make_model, capsys, flags, message):
    from hexswarm.peer.cli import main

    model_dir = make_model(**SHAPE)
    assert main([str(model_dir), "--layers", "0:2", "--partition", "auto", *flags, *UNREACHABLE]) == 2
    assert message in capsys.readouterr().err


def test_a_split_that_fits_no_rank_exits_2_before_loading(make_model, capsys, monkeypatch):
    """Ranks with 64 KiB free each: no share of the layers fits, said in one line."""
    import hexswarm.peer.tp.profile as tp_profile
    from hexswarm.peer.cli import main

    monkeypatch.setattr(tp_profile, "free_bytes", lambda device, tp: 64 * 1024)
    model_dir = make_model(**SHAPE)
    flags = ("--tp", "3", "--devices", "cpu,cpu,cpu", "--partition", "auto")
    assert main([str(model_dir), "--layers", "0:4", *flags, *UNREACHABLE]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--partition auto:" in error[0] and "free" in error[0], error
