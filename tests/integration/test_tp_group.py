"""A tensor-parallel group without the network: rank 0 in this process, rank 1 spawned."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.tp.group import TPGroup
from hexswarm.peer.tp.messages import Slowdown
from hexswarm.peer.tp.shard import Partition
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.protocol import ErrorCode, ProtocolError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CPU = torch.device("cpu")
TIMEOUT_S = 5.0


def test_stacks_of_other_ranges_and_degrees_load_beside_the_serving_one(make_model):
    """Moves of a TP peer (peer/range_move.py) on a group of 4 CPU ranks started for degrees
    1, 2 and 4: a stack of another range at the same degree, then at degree 2 (a sub-group of
    ranks 0-1), then at degree 1 (the leader alone) load while the older ones serve; sessions on
    every stack match one process; old stacks are dropped and the group stays healthy.

    First in this file: a group that failed, as the next test's does, leaves this process's
    default process group behind, and a process holds one."""
    spec = load_model_spec(make_model(arch="qwen2", layers=4, hidden=128, heads=4, kv_heads=4))
    reference = BlockStack.load(spec, 0, 4, torch.float32, CPU)
    failures: list[str] = []
    group = TPGroup(spec, 0, 2, torch.float32, (CPU,) * 4, TIMEOUT_S, failures.append, degrees=(1, 2, 4))
    hidden = torch.randn(1, 8, 128, generator=torch.Generator().manual_seed(1))
    sessions = {}

    def check(blocks, name, a, b):
        if name not in sessions:
            sessions[name] = (blocks.new_cache(name), reference.new_cache(name))
        cache, ref_cache = sessions[name]
        expected = reference(hidden[:, a:b], ref_cache, a, blocks.start, blocks.end)
        torch.testing.assert_close(
            blocks(hidden[:, a:b], cache, a, blocks.start, blocks.end), expected, atol=1e-4, rtol=1e-4
        )

    try:
        old = group.launch()
        check(old, "old", 0, 3)
        with ThreadPoolExecutor(1) as pool:
            loading = pool.submit(group.load_stack, 2, 4)
            check(old, "old", 3, 4)  # the old range serves meanwhile
            same_degree = loading.result(timeout=120)
        assert (same_degree.start, same_degree.end, same_degree.tp) == (2, 4, 4)
        half = group.load_stack(2, 4, tp=2)
        one = group.load_stack(0, 4, tp=1)
        assert (half.tp, one.tp) == (2, 1) and len(
            {old.stack_id, same_degree.stack_id, half.stack_id, one.stack_id}
        ) == 4
        for blocks, name in [(same_degree, "same"), (half, "half"), (one, "one")]:
            check(blocks, name, 0, 5)
        check(old, "old", 4, 6)  # its open session finishes on the old range
        check(half, "half", 5, 6)
        for blocks, name in [(old, "old"), (same_degree, "same"), (one, "one")]:
            blocks.release(name)
            group.drop_stack(blocks)
        check(half, "half", 6, 8)  # the stack on a sub-group still serves
        with pytest.raises(ValueError):
            group.load_stack(0, 4, tp=3)  # not a degree the group was started for
        assert not failures and group.failure is None
    finally:
        group.stop()


def test_an_uneven_split_matches_tp1_and_re_splits_open_sessions_exactly(make_model):
    """`--partition auto` on three CPU ranks, rank 2 three times slower from the start: the
    profiles give it the smallest share; prefill and decode match one process; then the group
    re-partitions to another split between two steps (as the drift check would) and the open
    session, its keys and values re-split over the ranks, goes on matching."""
    spec = load_model_spec(make_model(arch="llama", layers=3, hidden=128, heads=8, kv_heads=4))
    reference = BlockStack.load(spec, 0, 3, torch.float32, CPU)
    failures: list[str] = []
    group = TPGroup(
        spec, 0, 3, torch.float32, (CPU,) * 3, TIMEOUT_S, failures.append, partition="auto",
        slowdowns={2: Slowdown(3.0)},
    )  # fmt: skip
    hidden = torch.randn(1, 32, 128, generator=torch.Generator().manual_seed(2))  # 9+ decode steps
    try:
        blocks = group.launch()
        first = group.partition
        assert sum(first.kv_groups) == 4 and sum(first.mlp_columns) == spec.config.intermediate_size
        assert first.mlp_columns[2] < first.mlp_columns[0], first  # the slow rank computes least
        assert group.split.mode == "weight-stationary" and group.repartitioner is not None
        cache, ref_cache = blocks.new_cache("s"), reference.new_cache("s")

        def step(a: int, b: int) -> None:
            expected = reference(hidden[:, a:b], ref_cache, a, 0, 3)
            torch.testing.assert_close(blocks(hidden[:, a:b], cache, a, 0, 3), expected, atol=1e-4, rtol=1e-4)

        step(0, 5)  # prefill
        step(5, 6)
        other = Partition((1, 1, 2), (spec.config.intermediate_size - 64, 32, 32))
        with ThreadPoolExecutor(1) as pool:  # sessions open and close while the switch runs
            switching = pool.submit(group.repartition, blocks, other)
            while not switching.done():
                blocks.release(f"late-{len(blocks.caches)}")
                blocks.new_cache(f"late-{len(blocks.caches)}")
            switching.result(timeout=120)
        assert group.partition == other and group.repartitions == 1
        late, late_ref = blocks.new_cache("late"), reference.new_cache("late")
        torch.testing.assert_close(
            blocks(hidden[:, :4], late, 0, 0, 3),
            reference(hidden[:, :4], late_ref, 0, 0, 3),
            atol=1e-4,
            rtol=1e-4,
        )
        assert blocks.local.config.num_key_value_heads == 1
        for position in range(6, 9):  # decode on the new split
            step(position, position + 1)
        # the ranks report their decode compute with a step 0.5 s after their last report
        observed, steps, position, deadline = (), 0, 9, time.monotonic() + 30
        while len(observed) != 3 and position < 31 and time.monotonic() < deadline:
            step(position, position + 1)
            position += 1
            time.sleep(0.1)
            observed, steps = group.decode_window(blocks.stack_id, min_steps=1)
        assert len(observed) == 3 and steps >= 1 and all(s > 0 for s in observed), (observed, steps)
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
