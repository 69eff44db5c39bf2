"""The hidden fault-injection flags (peer.faults) on a real PeerCore, without the network."""

import pytest
import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.cli import build_parser
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.faults import FaultInjector, FaultPlan, plan_from_args
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.protocol import ErrorCode, Open, ProtocolError, Step


@pytest.fixture
def core(make_model):
    spec = load_model_spec(make_model(arch="llama"))
    blocks = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    core = PeerCore(blocks, spec.model_id, PeerLimits(max_sessions=2, max_length=16, cache_tokens=32))
    core.open(Open("s", spec.model_id, 0, 2, 16, 1, "float32"))
    return core


def _step(core, position: int, injector: FaultInjector):
    """A step as PeerServer runs it: validated, shown to the injector, computed, maybe poisoned."""
    session, hidden = core.begin_step(Step("s", position, torch.randn(1, 1, core.blocks.spec.hidden_size)))
    poison = injector.before_step(session)
    result = core.run_step(session, hidden)
    return injector.poison(result) if poison else result


def test_fail_after_n_steps_answers_internal_and_keeps_the_session_usable(core):
    injector = FaultInjector(core, FaultPlan(fail_after=2))
    _step(core, 0, injector)
    _step(core, 1, injector)
    with pytest.raises(ProtocolError) as info:
        _step(core, 2, injector)
    assert info.value.code == ErrorCode.INTERNAL
    assert core.sessions["s"].position == 2 and not core.sessions["s"].busy


def test_nan_fault_runs_the_step_and_returns_garbage(core):
    injector = FaultInjector(core, FaultPlan(on_signal=True, kind="nan"))
    assert torch.isfinite(_step(core, 0, injector).hidden).all()
    injector._arm(True)
    assert torch.isnan(_step(core, 1, injector).hidden).all()
    injector._arm(False)
    assert torch.isfinite(_step(core, 2, injector).hidden).all()


def test_error_rate_fails_some_steps(core):
    injector = FaultInjector(core, FaultPlan(error_rate=0.5, seed=3))
    outcomes = []
    for position in range(12):
        try:
            _step(core, position - sum(outcomes), injector)
            outcomes.append(False)
        except ProtocolError:
            outcomes.append(True)
    assert 0 < sum(outcomes) < 12


def test_flags_are_hidden_and_off_by_default():
    parser = build_parser()
    assert "--debug" not in parser.format_help()
    base = [
        "model",
        "--layers",
        "0:2",
        "--initial-peers",
        "/ip4/127.0.0.1/tcp/1/p2p/QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q",
    ]
    assert plan_from_args(parser.parse_args(base)) is None
    plan = plan_from_args(parser.parse_args([*base, "--debug-error-rate", "0.1", "--debug-seed", "4"]))
    assert plan == FaultPlan(error_rate=0.1, seed=4)
