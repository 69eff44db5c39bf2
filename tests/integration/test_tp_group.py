"""A tensor-parallel group without the network: rank 0 in this process, rank 1 spawned."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from peer.blocks import BlockStack
from peer.tp_group import TPGroup
from swarm.model_spec import load_model_spec
from swarm.protocol import ErrorCode, ProtocolError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CPU = torch.device("cpu")
TIMEOUT_S = 5.0


def test_a_second_range_loads_beside_the_first_which_keeps_serving_until_dropped(make_model):
    """A move of a TP peer (peer/range_move.py): the group loads [2, 4) on every rank while
    [0, 2) serves; sessions on either range match one process; the old range is then dropped
    and the group stays healthy.

    First in this file: a group that failed, as the next test's does, leaves this process's
    default process group behind, and a process holds one."""
    spec = load_model_spec(make_model(arch="qwen2", layers=4, hidden=128, heads=4, kv_heads=2))
    reference = BlockStack.load(spec, 0, 4, torch.float32, CPU)
    failures: list[str] = []
    group = TPGroup(spec, 0, 2, torch.float32, (CPU, CPU), TIMEOUT_S, failures.append)
    hidden = torch.randn(1, 6, 128, generator=torch.Generator().manual_seed(1))

    def check(blocks, cache, ref_cache, a, b, start, end):
        expected = reference(hidden[:, a:b], ref_cache, a, start, end)
        torch.testing.assert_close(
            blocks(hidden[:, a:b], cache, a, start, end), expected, atol=1e-4, rtol=1e-4
        )

    try:
        old = group.launch()
        old_cache, old_ref = old.new_cache("old"), reference.new_cache("old")
        check(old, old_cache, old_ref, 0, 3, 0, 2)
        with ThreadPoolExecutor(1) as pool:
            loading = pool.submit(group.load_stack, 2, 4)
            check(old, old_cache, old_ref, 3, 4, 0, 2)  # the old range serves meanwhile
            new = loading.result(timeout=120)
        assert (new.start, new.end, new.tp) == (2, 4, 2) and new.stack_id != old.stack_id
        new_cache, new_ref = new.new_cache("new"), reference.new_cache("new")
        check(new, new_cache, new_ref, 0, 5, 2, 4)
        check(old, old_cache, old_ref, 4, 6, 0, 2)  # its open session finishes on the old range
        old.release("old")
        group.drop_stack(old)
        check(new, new_cache, new_ref, 5, 6, 2, 4)
        assert not failures and group.failure is None
    finally:
        group.stop()


def test_hidden_states_match_tp1_and_a_hung_rank_fails_the_group(make_model):
    """Prefill and decode through TP 2 match one process (TP 1) within float tolerance; then
    rank 1 stops (SIGSTOP): the next step fails with PEER_FAILED within the timeout."""
    spec = load_model_spec(make_model(arch="qwen2", layers=4, hidden=128, heads=4, kv_heads=2))
    reference = BlockStack.load(spec, 0, 4, torch.float32, CPU)
    failures: list[str] = []
    group = TPGroup(spec, 0, 4, torch.float32, (CPU, CPU), TIMEOUT_S, failures.append)
    try:
        blocks = group.launch()
        ref_cache, cache = reference.new_cache("s"), blocks.new_cache("s")
        hidden = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(0))
        for a, b in [(0, 5), (5, 6), (6, 7)]:
            expected = reference(hidden[:, a:b], ref_cache, a, 1, 4)  # a sub-range, as a router may ask
            torch.testing.assert_close(blocks(hidden[:, a:b], cache, a, 1, 4), expected, atol=1e-4, rtol=1e-4)
        assert [d.type for d in group.device_info] == ["cpu", "cpu"]

        os.kill(group.rank_processes[1].pid, signal.SIGSTOP)
        began = time.monotonic()
        with pytest.raises(ProtocolError) as error:
            blocks(hidden[:, :1], cache, 7, 0, 4)
        assert error.value.code == ErrorCode.PEER_FAILED
        assert time.monotonic() - began < TIMEOUT_S + 5
        assert failures and "sent no heartbeat" in failures[0]
    finally:
        group.stop()
    assert all(proc.exitcode is not None for proc in group.rank_processes.values())
