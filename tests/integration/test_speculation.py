"""Speculative steps through the swarm: the client drafts, the chain checks several tokens in one
pass, peers roll back the rejected ones; greedy output stays the model's, token for token."""

import signal

import pytest
import torch
from transformers import StoppingCriteriaList

from tests.integration.conftest import PEERS, SignalHopPeer

pytestmark = pytest.mark.integration


def _repetitive_prompt(seed: int, length: int = 24) -> torch.Tensor:
    """A prompt that repeats itself, so n-gram lookup has something to draft from."""
    part = torch.randint(3, 400, (1, length // 3), generator=torch.Generator().manual_seed(seed))
    return torch.cat([part, part, part], dim=1)


def _rejected(model) -> int:
    return model.drafts.drafted - model.drafts.kept


def test_prompt_lookup_equals_plain_greedy_through_rejected_drafts(model, local_model):
    prompt = _repetitive_prompt(5)
    expected = local_model.generate(prompt, max_new_tokens=80, do_sample=False)
    model.drafts.timed.clear()
    got = model.generate(prompt, max_new_tokens=80, do_sample=False, prompt_lookup_num_tokens=6)
    assert torch.equal(got, expected), model.last_route
    # over 64 steps: each peer signed its commitments once, rolled-back steps included, and the
    # client's log of them agreed (a signature of other steps would have failed that hop over)
    assert not model.last_failovers, model.last_failovers
    passes = [tokens for tokens, _ in model.drafts.timed]
    assert max(passes) > 1, passes  # some passes checked drafts; a random model rejects most,
    assert model.drafts.kept < model.drafts.drafted  # so the peers rolled their caches back


def test_a_draft_model_equals_plain_greedy(model, local_model):
    prompt = torch.randint(3, 400, (1, 9), generator=torch.Generator().manual_seed(6))
    expected = local_model.generate(prompt, max_new_tokens=20, do_sample=False)
    model.drafts.timed.clear()
    got = model.generate(prompt, max_new_tokens=20, do_sample=False, assistant_model=local_model)
    assert torch.equal(got, expected), model.last_route
    passes = [tokens for tokens, _ in model.drafts.timed]
    assert len(passes) < 10, passes  # the model drafts for itself: every draft is kept


def test_verified_speculation_is_exact_and_blames_nobody(model, local_model):
    """A witness checks runs that rolled back: only the kept tokens are compared."""
    prompt = _repetitive_prompt(7, length=12)  # 28 tokens in all: "guard" (--max-length 32) may witness
    expected = local_model.generate(prompt, max_new_tokens=16, do_sample=False)
    before = (model.verify_stats.mismatches, model.verify_stats.liars)
    rejected = _rejected(model)
    model.verify_min_compared = 0.0  # a route through p2[2:6) has no witness for that span
    try:
        got = model.generate(
            prompt, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=5, verify=1.0
        )
    finally:
        model.verify_min_compared = None
    assert torch.equal(got, expected), model.last_route
    assert (model.verify_stats.mismatches, model.verify_stats.liars) == before
    summary = model.last_verification
    assert summary["compared"] > 0 and not summary["disputes"], summary
    assert _rejected(model) > rejected  # the checked runs rolled back


def test_failover_mid_speculation_replays_only_kept_tokens(swarm, model, local_model):
    prompt = _repetitive_prompt(8)
    kwargs = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, prompt_lookup_num_tokens=5)
    expected = local_model.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    hurt = SignalHopPeer(model, swarm.peers, tokens=4, hop=-1, sig=signal.SIGKILL)
    rejected = _rejected(model)
    try:
        got = model.generate(prompt, stopping_criteria=StoppingCriteriaList([hurt]), **kwargs)
        assert hurt.victim in ("p2", "p3"), model.last_route
        assert torch.equal(got, expected), model.last_route
        assert [f.peer for f in model.last_failovers] == [hurt.victim]
        assert _rejected(model) > rejected
    finally:
        if hurt.victim is not None:  # bring it back for the other tests
            swarm.local.stop(swarm.peers[hurt.victim], timeout=1)
            layers, extra = PEERS[hurt.victim]
            swarm.peers[hurt.victim] = swarm.local.start_peer(
                swarm.model_dir, layers, hurt.victim, "--announce-period", "1", *extra
            )
