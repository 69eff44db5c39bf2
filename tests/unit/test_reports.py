"""Verification reports (swarm/trust/reports.py): kept only when they name their evidence."""

import dataclasses

import msgpack
import pytest
import torch

from hexswarm.swarm.trust.reports import Report, tensor_hash

H1, H2, H3 = (tensor_hash(torch.full((1, 2), float(i))) for i in range(3))


def _report(**changes) -> Report:
    base = Report(
        reporter="QmReporter",
        reported="QmBad",
        model_id="m",
        start=0,
        end=2,
        position=5,
        input_hash=H1,
        reported_output_hash=H2,
        witness="QmGood",
        witness_output_hash=H3,
        max_abs_diff=0.5,
    )
    return dataclasses.replace(base, **changes)


def test_round_trip():
    report = _report(tie_breaker="QmThird")
    assert Report.from_bytes(report.to_bytes()) == report


@pytest.mark.parametrize(
    "changes",
    [
        {"input_hash": ""},
        {"reported_output_hash": "abc"},
        {"witness_output_hash": H2},  # the two outputs are the same: no evidence
        {"witness": "QmBad"},  # one peer cannot disagree with itself
        {"start": 3, "end": 2},
        {"position": "5"},
    ],
)
def test_report_without_evidence_is_refused(changes):
    with pytest.raises(ValueError):
        Report.from_bytes(_report(**changes).to_bytes())


def test_garbage_and_other_schemas_are_refused():
    for data in [
        b"\xc1",
        msgpack.packb([1]),
        msgpack.packb({**dataclasses.asdict(_report()), "schema": 2}),
        b"x" * 9000,
    ]:
        with pytest.raises(ValueError):
            Report.from_bytes(data)


def test_tensor_hash_names_dtype_shape_and_bytes():
    x = torch.arange(4.0)
    assert tensor_hash(x) == tensor_hash(x.clone())
    assert len({tensor_hash(x), tensor_hash(x.reshape(2, 2)), tensor_hash(x.half()), tensor_hash(x + 1)}) == 4
