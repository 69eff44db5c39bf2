"""Batched decode and chunked prefill on a real BlockStack, without the network.

Each session's output under any batching must equal that session run alone (float tolerance),
whatever the mix of lengths, positions and batch sizes.
"""

import threading
import time

import pytest
import torch

from hexswarm.peer import batch_forward
from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.scheduler import BatchPolicy, StepScheduler
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.protocol import Open, Step

CPU = torch.device("cpu")
HIDDEN = 128
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def stack(make_model):
    spec = load_model_spec(make_model(arch="llama"))
    return BlockStack.load(spec, 0, 6, torch.float32, CPU)


def _alone(stack, prompt, decode_steps, start=0, end=6):
    """Reference: one session, prefill then one-token steps, with its own cache."""
    cache = stack.new_cache("ref")
    outputs = [stack(prompt, cache, 0, start, end)]
    position = prompt.shape[1]
    for token in decode_steps:
        outputs.append(stack(token, cache, position, start, end))
        position += 1
    return outputs


def test_forward_batch_equals_each_session_alone(stack):
    torch.manual_seed(0)
    shapes = [(1, 3), (2, 7), (1, 1), (3, 12)]  # (batch, prompt length): all positions differ
    prompts = [torch.randn(b, n, HIDDEN) for b, n in shapes]
    steps = [[torch.randn(b, 1, HIDDEN) for _ in range(4)] for b, _ in shapes]
    expected = [_alone(stack, p, s) for p, s in zip(prompts, steps, strict=True)]

    caches = [stack.new_cache(f"s{i}") for i in range(len(shapes))]
    positions = [n for _, n in shapes]
    for cache, prompt in zip(caches, prompts, strict=True):
        stack(prompt, cache, 0, 0, 6)
    for k in range(4):
        hiddens = [s[k] for s in steps]
        outputs = stack.forward_batch(hiddens, caches, positions, 0, 6)
        for i, output in enumerate(outputs):
            torch.testing.assert_close(output, expected[i][k + 1], **TOL)
        positions = [p + 1 for p in positions]


def test_padded_key_slots_keep_each_session_exact(stack, monkeypatch):
    """On CUDA the stacked keys are padded to a multiple of 128 (cuDNN reuses its graphs);
    the same padding, forced here on the CPU, must leave every session's output unchanged."""
    monkeypatch.setitem(batch_forward.KEY_SLOT_MULTIPLE, "cpu", 16)
    assert batch_forward.key_slots([5, 17], CPU) == 32
    test_forward_batch_equals_each_session_alone(stack)


def test_padding_mask_is_additive_and_hides_only_padding():
    mask = batch_forward.padding_mask([2, 1], [3, 5], 8, torch.float16, CPU)
    assert mask.shape == (3, 1, 1, 8) and mask.dtype == torch.float16
    visible = mask[:, 0, 0] == 0
    assert visible.sum(dim=1).tolist() == [3, 3, 5]  # each row sees exactly its session's keys
    assert visible[:, 0].all() and torch.isneginf(mask[:, 0, 0][~visible]).all()
    assert batch_forward.key_slots([3, 5], CPU) == 5  # no padding on the CPU


def test_sliding_window_stacks_do_not_batch(make_model, stack):
    mistral = load_model_spec(make_model(arch="mistral"))  # tiny mistral has a sliding window
    assert stack.supports_batching
    assert not BlockStack(mistral, 0, 2, torch.float32, CPU).supports_batching


def _core(stack, sessions=16):
    limits = PeerLimits(max_sessions=sessions, max_length=64, max_batch=4, cache_tokens=sessions * 256)
    return PeerCore(stack, stack.spec.model_id, limits)


def _drive(core, scheduler, session_id, prompt, steps, start, end, results, barrier):
    """A client: opens, prefills, then decodes one token at a time, waiting for each answer."""
    core.open(Open(session_id, core.model_id, start, end, 64, prompt.shape[0], "float32"))
    barrier.wait()
    outputs, position = [], 0
    for hidden in [prompt, *steps]:
        session, tensor = core.begin_step(Step(session_id, position, hidden))
        outputs.append(scheduler.submit(session, tensor).future.result(timeout=60).hidden)
        position += hidden.shape[1]
    results[session_id] = outputs


@pytest.mark.parametrize("batching", [True, False])
def test_scheduler_under_concurrency_equals_each_alone(stack, batching):
    """8 client threads, different prompts, batch sizes and block ranges, all at once."""
    torch.manual_seed(1)
    clients = {}
    for i in range(8):
        batch, length = 1 + i % 3, 2 + 5 * i
        start, end = (0, 6) if i % 4 else (2, 5)
        prompt = torch.randn(batch, length, HIDDEN)
        clients[f"c{i}"] = (prompt, [torch.randn(batch, 1, HIDDEN) for _ in range(6)], start, end)
    core = _core(stack)
    policy = BatchPolicy(batching=batching, batch_window_ms=5.0, max_batch_tokens=8, prefill_chunk_tokens=8)
    scheduler = StepScheduler(core, policy)
    results, barrier = {}, threading.Barrier(len(clients))
    threads = [
        threading.Thread(target=_drive, args=(core, scheduler, sid, *client, results, barrier))
        for sid, client in clients.items()
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        scheduler.stop()
    assert sorted(results) == sorted(clients)
    for sid, (prompt, steps, start, end) in clients.items():
        for got, want in zip(results[sid], _alone(stack, prompt, steps, start, end), strict=True):
            torch.testing.assert_close(got, want, **TOL)
    batched_rows = max(scheduler.batch_sizes)
    if batching:
        assert batched_rows > 3  # steps of several sessions did run together
        assert batched_rows <= policy.max_batch_tokens
    else:
        assert batched_rows <= 3  # one session (of up to 3 rows) at a time


def test_a_long_prefill_does_not_stall_decode_steps(stack):
    """A decode step queued behind a 40-token prompt runs after its first chunk, not after all."""
    core = _core(stack)
    scheduler = StepScheduler(core, BatchPolicy(batch_window_ms=0.0, prefill_chunk_tokens=8))
    try:
        for sid in ("long", "short"):
            core.open(Open(sid, core.model_id, 0, 6, 64, 1, "float32"))
        session, tensor = core.begin_step(Step("short", 0, torch.randn(1, 2, HIDDEN)))
        scheduler.submit(session, tensor).future.result(timeout=30)
        with scheduler.cond:  # queue both before the compute thread looks
            prompt = torch.randn(1, 40, HIDDEN)
            long_job = scheduler.submit(*core.begin_step(Step("long", 0, prompt)))
            short_job = scheduler.submit(*core.begin_step(Step("short", 2, torch.randn(1, 1, HIDDEN))))
            seen = []  # the prompt's progress when the decode step is answered (on the compute thread)
            short_job.future.add_done_callback(lambda _: seen.append(long_job.done_tokens))
        short_job.future.result(timeout=30)
        got = long_job.future.result(timeout=30).hidden
    finally:
        scheduler.stop()
    assert seen == [0] or seen == [8]  # before or after its first chunk, never after all 40
    torch.testing.assert_close(got, _alone(stack, prompt, [])[0], **TOL)


def test_announced_decode_capacity_counts_batching(stack, tmp_path, monkeypatch):
    from hexswarm.peer.throughput import DECODE_BATCH, measure_or_load

    monkeypatch.setenv("HEXSWARM_CACHE_DIR", str(tmp_path))
    figures = measure_or_load(stack)
    assert figures.decode_batch_size == DECODE_BATCH
    # Batching is what makes the figure larger than one session's 1000 / decode_ms_per_block;
    # by how much is a benchmark's business (benchmarks/concurrency.py), not a test's.
    assert figures.decode_batch_tokens_per_s > 0
    assert measure_or_load(stack) == figures  # cached


def test_measured_speeds_are_cached_per_weight_format(stack, make_model):
    """An int8 peer's figures must never be announced by a float32 peer of the same shape."""
    from hexswarm.peer.throughput import cache_key

    int8 = BlockStack.load(stack.spec, 0, 2, torch.float32, CPU, quant="int8")
    assert cache_key(int8) != cache_key(stack)
    assert "-qint8-" in cache_key(int8) and "-qnone-" in cache_key(stack)


def _run_prompts(core, scheduler, prompts) -> tuple[list, list[str]]:
    """Opens a session per (owner, session id, prompt tokens, background) and queues all their
    prompts before the compute thread looks; returns the jobs and the session ids in the order
    they finished (the scheduler is stopped after)."""
    finished = []
    try:
        for owner, sid, _, _ in prompts:
            core.open(Open(sid, core.model_id, 0, 6, 64, 1, "float32"), owner)
        with scheduler.cond:
            jobs = []
            for owner, sid, tokens, background in prompts:
                step = core.begin_step(Step(sid, 0, torch.randn(1, tokens, HIDDEN)), owner)
                job = scheduler.submit(*step, background=background)
                job.future.add_done_callback(lambda _, sid=sid: finished.append(sid))
                jobs.append(job)
        for job in jobs:
            job.future.result(timeout=60)
    finally:
        scheduler.stop()
    return jobs, finished


def test_prompt_compute_is_shared_fairly_between_remotes_not_prompts(stack):
    """One remote queues three 40-token prompts, another one after them: chunks alternate
    between the two remotes, so the second one's prompt is done before the first one's last two."""
    core = _core(stack)
    scheduler = StepScheduler(core, BatchPolicy(batch_window_ms=0.0, prefill_chunk_tokens=8))
    prompts = [
        (owner, sid, 40, False)
        for owner, sid in (("QmHog", "h0"), ("QmHog", "h1"), ("QmHog", "h2"), ("QmFair", "f0"))
    ]
    _, finished = _run_prompts(core, scheduler, prompts)
    assert finished.index("f0") < 2, finished  # before the hog's second prompt is done
    assert scheduler.served == {"QmHog": 120, "QmFair": 40}  # prompt tokens (no decode ran)


@pytest.mark.parametrize("batching", [True, False])
def test_background_work_advances_only_when_no_client_prompt_waits(stack, batching):
    """A stranger's evidence re-check (background) queued first, two clients' prompts after it:
    both prompts are done before the re-check's second chunk, which the same queue without the
    background mark would have run between them."""
    core = _core(stack)
    policy = BatchPolicy(batch_window_ms=0.0, prefill_chunk_tokens=8, batching=batching)
    prompts = [("evidence-recheck", "r", 48, True), ("QmA", "a", 16, False), ("QmB", "b", 16, False)]
    jobs, finished = _run_prompts(core, StepScheduler(core, policy), prompts)
    assert finished == ["a", "b", "r"] or finished == ["b", "a", "r"], finished
    assert jobs[0].done_tokens == 48


def test_decode_rows_over_one_batch_go_to_the_least_served_remote_first(stack):
    """A remote with four decode steps waiting and another with one, two rows a batch: the
    other remote's row runs in the first batch, not after the first remote's four."""
    core = _core(stack)
    scheduler = StepScheduler(core, BatchPolicy(batch_window_ms=0.0, max_batch_tokens=2))
    batches = []
    run = core.run_decode_batch
    core.run_decode_batch = lambda steps: batches.append([s.owner for s, _ in steps]) or run(steps)
    try:
        sessions = [("QmMany", f"m{i}") for i in range(4)] + [("QmOne", "o0")]
        for owner, sid in sessions:
            core.open(Open(sid, core.model_id, 0, 6, 64, 1, "float32"), owner)
        scheduler.served["QmMany"] = 10  # served before: its rows wait behind the other's
        with scheduler.cond:  # all five queued before the compute thread looks
            jobs = [
                scheduler.submit(*core.begin_step(Step(sid, 0, torch.randn(1, 1, HIDDEN)), owner))
                for owner, sid in sessions
            ]
        for job in jobs:
            job.future.result(timeout=60)
    finally:
        scheduler.stop()
    assert "QmOne" in batches[0], batches
    assert scheduler.served == {"QmMany": 14, "QmOne": 1}


def test_chunks_shrink_to_about_a_decode_batchs_time_while_sessions_decode(stack):
    """A 256-token chunk of a prompt that takes 1 ms a token would hold a decoding session 256 ms;
    while decode batches of 40 ms run, chunks take 40 tokens (never under 16), and the policy's
    chunk again once nobody has decoded for DECODE_ACTIVE_S."""
    from types import SimpleNamespace

    from hexswarm.peer import scheduler as sched

    scheduler = StepScheduler(_core(stack), BatchPolicy(prefill_chunk_tokens=256))
    try:
        job = SimpleNamespace(rows=1, hidden=torch.zeros(1, 2048, HIDDEN))
        scheduler.chunk_ms_per_token = 1.0
        assert scheduler._chunk_tokens(job) == 256  # nobody decoding
        scheduler.decode_ms, scheduler.last_decode_at = 40.0, time.perf_counter()
        assert scheduler._chunk_tokens(job) == 40
        scheduler.decode_ms = 4.0
        assert scheduler._chunk_tokens(job) == sched.MIN_CHUNK_TOKENS
        scheduler.last_decode_at -= sched.DECODE_ACTIVE_S
        assert scheduler._chunk_tokens(job) == 256
    finally:
        scheduler.stop()


def test_a_session_is_waited_for_only_when_its_next_step_is_due_in_the_window():
    from hexswarm.peer.scheduler import Rhythm

    deadline = 10.0
    assert Rhythm(ended=9.0, gap_s=0.5).arrives_by(deadline, now=9.2)  # due at 9.5
    assert not Rhythm(ended=9.0).arrives_by(deadline, now=9.2)  # its rhythm is not known yet
    assert not Rhythm(ended=9.0, gap_s=2.0).arrives_by(deadline, now=9.2)  # steps too slowly
    assert not Rhythm(ended=8.0, gap_s=0.4).arrives_by(deadline, now=8.9)  # a whole gap late: stopped


def _prefilled(core, scheduler, session_id):
    core.open(Open(session_id, core.model_id, 0, 6, 64, 1, "float32"))
    session, tensor = core.begin_step(Step(session_id, 0, torch.randn(1, 3, HIDDEN)))
    scheduler.submit(session, tensor).future.result(timeout=60)
    return session


@pytest.mark.parametrize("due", [True, False], ids=["due", "not-due"])
def test_decode_steps_on_their_way_join_one_batch(stack, due):
    """Session b is decoding here with a 40 ms rhythm; a's step comes, b's 30 ms later. With an
    aligned wait of up to 1 x a 300 ms decode batch they run as one batch; when b's rhythm says
    it will not come in time, a runs alone after the 2 ms window."""
    from hexswarm.peer.scheduler import Rhythm

    core = _core(stack)
    scheduler = StepScheduler(core, BatchPolicy(batch_window_ms=2.0, align_ratio=1.0))
    try:
        a, b, _idle = (_prefilled(core, scheduler, name) for name in ("a", "b", "idle"))
        scheduler.decode_ms = 300.0
        gap_s = 0.04 if due else 5.0
        scheduler.decoding[b.key] = Rhythm(ended=time.perf_counter() - 0.01, gap_s=gap_s)
        scheduler.batch_sizes.clear()
        jobs = []
        for session in (a, b):
            stepped, tensor = core.begin_step(Step(session.session_id, 3, torch.randn(1, 1, HIDDEN)))
            jobs.append(scheduler.submit(stepped, tensor))
            time.sleep(0.03)
        for job in jobs:
            job.future.result(timeout=60)
        assert scheduler.batch_sizes == ({2: 1} if due else {1: 2}), scheduler.batch_sizes
    finally:
        scheduler.stop()
