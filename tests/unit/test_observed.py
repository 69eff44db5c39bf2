"""What a client observes of peers' decode times (client/observed.py) against what they announce."""

from __future__ import annotations

from hexswarm.client.observed import HOP_OVERHEAD_MS, MIN_SAMPLES, ObservedSpeeds
from hexswarm.client.peer_views import peer_view
from tests.unit.record_cases import make_record


def test_an_observation_needs_enough_samples_and_is_their_median():
    observed = ObservedSpeeds()
    for ms in [10.0] * (MIN_SAMPLES - 1):
        observed.add("p", HOP_OVERHEAD_MS + 2 * ms, blocks=2)
    assert observed.ms_per_block("p") is None
    observed.add("p", HOP_OVERHEAD_MS + 2 * 5000.0, blocks=2)  # one stall moves no median
    assert observed.ms_per_block("p") == 10.0
    observed.add("p", -1.0, blocks=2)  # nonsense is dropped
    observed.add("p", 10.0, blocks=0)
    assert len(observed.samples["p"]) == MIN_SAMPLES


def test_a_peer_announcing_over_twice_its_observed_speed_is_routed_by_observation():
    observed = ObservedSpeeds()
    for _ in range(MIN_SAMPLES):
        observed.add("liar", HOP_OVERHEAD_MS + 4 * 25.0, blocks=4)  # 25 ms a block
        observed.add("honest", HOP_OVERHEAD_MS + 4 * 1.5, blocks=4)  # 1.5 against 1.0 announced
    liar = make_record(
        peer_id="liar", decode_ms_per_block=0.25, throughput=1e6, decode_batch_tokens_per_s=8e6
    )
    view = peer_view(liar, observed)
    assert view.decode_ms_per_block == 50.0  # 25 observed, twice that for the lie
    assert view.throughput == 1e6 * 0.25 / 50.0 and view.decode_batch_tokens_per_s == 8e6 * 0.005
    assert observed.flagged == {"liar"}
    honest = make_record(peer_id="honest", decode_ms_per_block=1.0, throughput=1000.0)
    assert peer_view(honest, observed) == peer_view(honest)  # within 2x: its own figures stand
    assert peer_view(make_record(peer_id="unseen"), observed) == peer_view(make_record(peer_id="unseen"))


def test_a_routed_figure_moves_only_when_what_is_observed_moves_by_a_quarter():
    observed = ObservedSpeeds()
    for _ in range(MIN_SAMPLES):
        observed.add("liar", HOP_OVERHEAD_MS + 10.0, blocks=1)
    assert observed.effective_ms_per_block("liar", 0.01) == 20.0
    for ms in (11.0, 11.0, 11.0, 11.0, 11.0):  # the median moves 10%: the view stays as it was
        observed.add("liar", HOP_OVERHEAD_MS + ms, blocks=1)
    assert observed.effective_ms_per_block("liar", 0.01) == 20.0
    for _ in range(MIN_SAMPLES * 2):
        observed.add("liar", HOP_OVERHEAD_MS + 30.0, blocks=1)
    assert observed.effective_ms_per_block("liar", 0.01) == 60.0
