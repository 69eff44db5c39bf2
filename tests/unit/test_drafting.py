"""How many drafted tokens a pass through the chain checks (client/drafting.py), and what a
roll-back leaves of a session's kept inputs (client/history.py)."""

import torch

from hexswarm.client.drafting import PROBE_EVERY, Acceptance, DraftLength, rolls_back
from hexswarm.client.history import InputHistory


def _timed(length: DraftLength, one_s: float, per_token_s: float) -> DraftLength:
    for tokens in (1, 1, 3, 5, 1, 4):
        length.passed(tokens, one_s + (tokens - 1) * per_token_s)
    return length


def _accepting(rate: float, passes: int = 40) -> Acceptance:
    """Passes of 4 drafts whose acceptance is about `rate`."""
    acceptance = Acceptance()
    for i in range(passes):
        acceptance.judged(4, 4 if (i * rate) % 1 + rate >= 1 else 0)
    return acceptance


def test_before_any_measurement_a_pass_drafts_a_few():
    assert DraftLength().plan(Acceptance()) == 4


def test_a_wan_round_trip_drafts_many_even_at_modest_acceptance():
    wan = _timed(DraftLength(), one_s=0.300, per_token_s=0.004)
    assert wan.plan(_accepting(rate=0.5)) >= 5


def test_a_lan_with_rejected_drafts_stops_drafting_then_probes_again():
    lan, acceptance = _timed(DraftLength(), one_s=0.060, per_token_s=0.020), Acceptance()
    for _ in range(30):
        acceptance.judged(3, 0)
    assert lan.plan(acceptance) == 0
    for _ in range(PROBE_EVERY):
        acceptance.judged(0, 0)  # passes without drafts
    assert lan.plan(acceptance) == 1  # acceptance may have changed: one draft re-measures it


def test_counts_of_drafted_and_kept_tokens():
    length = DraftLength()
    for drafts, matched in [(4, 2), (0, 0), (3, 3)]:
        length.counted(drafts, matched)
    assert (length.drafted, length.kept) == (7, 5)


def test_sliding_windows_cannot_roll_back():
    class Config:
        layer_types = ["full_attention", "sliding_attention"]

    assert not rolls_back(Config())
    Config.layer_types = ["full_attention"]
    assert rolls_back(Config())


def test_a_roll_back_drops_the_last_tokens_of_every_kept_boundary():
    history = InputHistory(bytes_per_boundary=1, max_bytes=10)
    history.keep([0, 4])
    history.append({0: torch.arange(5.0).view(1, 5, 1), 4: torch.arange(5.0).view(1, 5, 1) + 10})
    history.append({0: torch.tensor([[[5.0], [6.0]]]), 4: torch.tensor([[[15.0], [16.0]]])})
    history.drop_last(3)
    assert history.inputs(0).flatten().tolist() == [0, 1, 2, 3]
    assert history.inputs(4).flatten().tolist() == [10, 11, 12, 13]
    history.append({0: torch.tensor([[[9.0]]]), 4: torch.tensor([[[19.0]]])})
    assert history.sent_whole(0).flatten().tolist() == [0, 1, 2, 3, 9]
