"""The peer's compute thread: batches decode steps across sessions and chunks long prefills.

Every validated step becomes a `Job` on one queue, served by one compute thread:

- **Batched decode.** One-token steps of different sessions (any position, any batch size,
  any client) run as one forward (`PeerCore.run_decode_batch`). A batch forms while a short
  window lasts after the first waiting decode step (`batch_window_ms`), or until
  `max_batch_tokens` rows wait, or until every open session has a step waiting (nobody else
  can join, so waiting longer only adds latency: a lone client never waits). Orca (Yu et
  al., OSDI '22) calls this iteration-level scheduling.
- **Aligned steps (opt-in).** While sessions are decoding, a batch waits longer for the ones that are
  on their way: up to `align_ratio` x a decode batch's measured time, for each session that
  is decoding here and whose next step should come by then (its last step's end plus its
  usual gap: `Rhythm`). A decode forward reads every weight of the blocks whatever its rows,
  so on a peer bound by memory a straggler run in a batch of its own costs a whole batch's
  time; waiting less than that for it costs less. But on a chain of several peers, sessions
  that all move together leave the other peers idle while one computes: pipelining needs about
  as many groups of sessions in flight as the chain has peers. Four clients of a 1024-wide
  model through two peers on one 2-core machine formed batches of 2.7-2.9 rows aligned against
  1.4 without, yet got 19.5 tokens/s against 22.0 (each peer's compute thread busy 57% of the
  run against 84%; benchmarks/concurrency.py). So it is off by default; it pays on a peer that
  serves the whole model, or with many more sessions than peers. A session that is a whole gap late (it
  stopped), one that steps slowly and one whose rhythm is not known yet are not waited for,
  so a remote cannot hold batches back by pacing its steps; a waiting prompt ends the wait.
- **Chunked prefill.** A prompt runs `prefill_chunk_tokens` at a time, and each round runs
  at most one chunk next to the decode batch, so a long prompt delays the other sessions'
  tokens by one chunk's time instead of the whole prompt's (SARATHI, Agrawal et al. 2023).
  While other sessions are decoding (a decode batch ran within DECODE_ACTIVE_S), a chunk is
  sized to take about as long as a decode batch (`interleave_ratio` x its measured time, at
  least MIN_CHUNK_TOKENS): SARATHI's token budget per iteration, set from measured times, so
  that back-to-back long prompts (from one remote or from twenty identities) cost each decoding
  session about one decode step's wait per token, not one full chunk's.

- **Fair shares of compute, in tokens.** Each account (the session's IP group, else its
  remote: `account_of`) is counted the tokens computed for it, prompt and decode alike. The
  chunk each round runs goes to the account served the fewest tokens, and when more decode
  rows wait than one batch holds, the least-served accounts' rows go first. So a remote
  sending back-to-back long prompts gets one chunk in turn with every other account that has
  a prompt waiting, not one per prompt it queued, and a remote with many sessions cannot fill
  a decode batch before others' rows. An account that had
  nothing queued starts level with the least-served account waiting (start-time fair
  queueing), so idle time banks no credit and a fresh identity jumps no queue.
- **Background work last.** A job submitted as background (a re-check of evidence a stranger
  sent: peer/evidence_service.py) advances by a chunk only in rounds where no other prompt
  waits, so however much of it is queued, a client's prompt never waits behind it for more than
  the chunk in progress.

With `batching=False` jobs run one at a time in arrival order (the baseline of
benchmarks/concurrency.py); prefills are still chunked when a chunk size is set.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from hexswarm.peer.core import PeerCore, Session
from hexswarm.swarm.wire.protocol import ErrorCode, ProtocolError, StepResult

logger = logging.getLogger(__name__)

MAX_ACCOUNTS = 4096  # accounts remembered by the fair shares
DECODE_ACTIVE_S = 0.5  # a decode batch this recent means sessions are decoding: chunks shrink
MIN_CHUNK_TOKENS = 16  # a chunk no smaller than this (each forward has its own fixed cost)
EMA = 0.2  # weight of the newest measurement in the running step times


@dataclass(frozen=True)
class BatchPolicy:
    batching: bool = True
    batch_window_ms: float = 2.0  # longest wait for more decode steps after the first one
    max_batch_tokens: int = 64  # rows of one decode batch (one token each)
    prefill_chunk_tokens: int = 256  # 0: prefills run whole
    interleave_ratio: float = 1.0  # while sessions decode, a chunk takes ~this x a decode batch (0: off)
    align_ratio: float = 0.0  # waits up to this x a decode batch for decoding sessions' steps (0: off)


@dataclass
class Job:
    """One step of one session, maybe run in chunks; `future` gets its StepResult or error."""

    session: Session
    hidden: torch.Tensor  # (batch, new_tokens, hidden) in the compute dtype
    future: Future = field(default_factory=Future)
    done_tokens: int = 0  # of a chunked prefill
    outputs: list[torch.Tensor] = field(default_factory=list)
    arrived: float = field(default_factory=time.perf_counter)
    compute_started: float = 0.0  # perf_counter when its (first) forward began
    compute_ended: float = 0.0  # perf_counter when its (last) forward ended
    window_s: float = 0.0  # time spent waiting for a batch to fill
    background: bool = False  # runs only when no other prompt waits (module docstring)

    @property
    def is_decode(self) -> bool:
        return self.hidden.shape[1] == 1

    @property
    def rows(self) -> int:
        return self.hidden.shape[0]


@dataclass
class Rhythm:
    """When a session's last decode step ended here, and how long its next one usually takes
    to arrive (the rest of its chain and its client's work: a running mean)."""

    ended: float
    gap_s: float = 0.0

    def arrives_by(self, deadline: float, now: float) -> bool:
        """Whether its next step should arrive by `deadline`: it usually would, and is not
        already a whole gap late (it stopped). A session whose rhythm is not known yet, or
        that steps slowly, is not waited for."""
        due = self.ended + self.gap_s
        return self.gap_s > 0 and due <= deadline and now < due + self.gap_s


class StepScheduler:
    """Runs `PeerCore` steps on one compute thread; `submit` may be called from any thread."""

    def __init__(self, core: PeerCore, policy: BatchPolicy):
        self.core, self.policy = core, policy
        self.can_batch = policy.batching and core.can_batch
        self.queue: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition()
        self.stopped = False
        self.batch_sizes = collections.Counter()  # decode batch rows -> how many batches ran
        self.busy_s = 0.0  # seconds the compute thread spent in forwards since `busy_since`
        self.busy_since = time.perf_counter()
        self.served: dict[str, int] = {}  # account -> prompt tokens computed (fair shares)
        self.account_of = lambda session: session.owner  # the server counts IP groups instead
        self.decode_ms = 0.0  # running mean of a decode batch's compute
        self.chunk_ms_per_token = 0.0  # running mean of a prefill chunk's compute per token
        self.last_decode_at = float("-inf")  # perf_counter when the last decode batch ended
        self.aligning = self.can_batch and policy.align_ratio > 0  # aligned steps: module docstring
        self.decoding: dict[str, Rhythm] = {}  # session key -> when it decoded, how often (aligning)
        self.thread = threading.Thread(target=self._loop, name="compute", daemon=True)
        self.thread.start()

    def submit(self, session: Session, hidden: torch.Tensor, background: bool = False) -> Job:
        """Queues a step validated by PeerCore.begin_step; its future completes on the compute thread.

        Every step runs there, even a lone session's decode step that would be cheaper to run
        in the calling thread: on the event loop it would hold up pings, other streams' frames
        and a tensor-parallel group's failure callback for as long as it computes (and for up
        to --tp-timeout when a rank hangs in a collective).
        """
        job = Job(session, hidden, background=background)
        with self.cond:
            if self.stopped:
                raise RuntimeError("the compute thread is stopped")
            if not job.is_decode:
                self._level(self.account_of(session))
            elif self.aligning and (rhythm := self.decoding.get(session.key)) is not None:
                rhythm.gap_s = _mean(rhythm.gap_s, job.arrived - rhythm.ended)
            self.queue.append(job)
            self.cond.notify()
        return job

    def take_busy(self) -> tuple[float, float]:
        """(seconds the compute thread spent in forwards, seconds elapsed) since the last call;
        the rest it waited for work or for a batch to fill."""
        now = time.perf_counter()
        taken = (self.busy_s, now - self.busy_since)
        self.busy_s, self.busy_since = 0.0, now
        return taken

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()
        self.thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            decodes, prefill = self._next_round()
            if decodes is None:
                return
            if decodes:
                self._run_decodes(decodes)
            if prefill is not None:
                self._run_chunk(prefill)

    def _next_round(self) -> tuple[list[Job] | None, Job | None]:
        """Waits for work; returns (decode jobs to batch, one prefill job to advance by a chunk)."""
        with self.cond:
            while not self.queue and not self.stopped:
                self.cond.wait()
            if self.stopped:
                return None, None
            if not self.can_batch:
                job = next((j for j in self.queue if not j.background), self.queue[0])
                self.queue.remove(job)
                return ([job], None) if job.is_decode else ([], job)
            self._wait_for_batch()
            decodes, rows = [], 0
            for job in self._least_served_first(j for j in self.queue if j.is_decode):
                if rows + job.rows <= self.policy.max_batch_tokens or not decodes:  # one always runs
                    decodes.append(job)
                    rows += job.rows
            chosen = {id(job) for job in decodes}
            rest = collections.deque(job for job in self.queue if id(job) not in chosen)
            prefill = self._fairest_prefill(rest)
            if prefill is not None:
                rest.remove(prefill)
            self.queue = rest
            return decodes, prefill

    def _least_served_first(self, jobs) -> list[Job]:
        """`jobs` by their account's tokens served, oldest first within one (a stable sort):
        when more decode rows wait than a batch holds, the accounts served least go first."""
        return sorted(jobs, key=lambda job: self.served.get(self.account_of(job.session), 0))

    def _fairest_prefill(self, jobs) -> Job | None:
        """The oldest prefill of the least-served account, a background one only when no other
        waits (called holding the lock)."""
        prefills = [job for job in jobs if not job.is_decode]
        foreground = [job for job in prefills if not job.background]
        if not foreground:
            return prefills[0] if prefills else None
        return min(foreground, key=lambda job: self.served.get(self.account_of(job.session), 0))

    def _count(self, account: str, tokens: int) -> None:
        """Tokens computed for `account` (called holding the lock)."""
        self.served[account] = self.served.get(account, 0) + tokens

    def _level(self, account: str) -> None:
        """An account with no prompt waiting starts level with the least-served one waiting."""
        waiting = {self.account_of(job.session) for job in self.queue if not job.is_decode}
        if account in waiting:
            return
        floor = min((self.served.get(a, 0) for a in waiting), default=0)
        self.served[account] = max(self.served.get(account, 0), floor)
        if len(self.served) > MAX_ACCOUNTS:  # forget the accounts with nothing waiting
            self.served = {a: n for a, n in self.served.items() if a in waiting or a == account}

    def _wait_for_batch(self) -> None:
        """Lets more decode steps join while the window lasts (called holding the lock)."""
        first = next((job for job in self.queue if job.is_decode), None)
        if first is None:
            return
        window_s = self.policy.batch_window_ms / 1000
        aligned_s = first.arrived + self.policy.align_ratio * self.decode_ms / 1000
        began = time.perf_counter()
        while not self.stopped and not self._batch_full():
            now = time.perf_counter()
            left = first.arrived + window_s - now
            if left <= 0 and self.aligning and self._on_their_way(aligned_s, now):
                left = aligned_s - now  # module docstring: aligned steps
            if left <= 0:
                break
            self.cond.wait(left)
        ended = time.perf_counter()
        for job in self.queue:
            job.window_s = ended - max(began, job.arrived)

    def _batch_full(self) -> bool:
        waiting_rows = sum(job.rows for job in self.queue if job.is_decode)
        # Every open session has a step queued: nobody else can join this round.
        return waiting_rows >= self.policy.max_batch_tokens or len(self.queue) >= len(self.core.sessions)

    def _on_their_way(self, deadline: float, now: float) -> bool:
        """Whether a session decoding here should send its next step by `deadline` and has not
        yet, and no prompt waits (it would use the time): the aligned wait is worth it then
        (called holding the lock)."""
        if any(not job.is_decode for job in self.queue):
            return False
        waiting = {job.session.key for job in self.queue}
        return any(
            rhythm.arrives_by(deadline, now) and key not in waiting and key in self.core.sessions
            for key, rhythm in self.decoding.items()
        )

    def _run_decodes(self, jobs: list[Job]) -> None:
        live = [job for job in jobs if self._still_open(job)]
        if not live:
            return
        began = time.perf_counter()
        for job in live:
            job.compute_started = began
        try:
            results = self.core.run_decode_batch([(job.session, job.hidden) for job in live])
        except Exception as e:  # each waiting client hears about it; the thread goes on
            logger.exception("decode batch of %d sessions failed", len(live))
            for job in live:
                job.future.set_exception(e)
            return
        ended = time.perf_counter()
        self.batch_sizes[sum(job.rows for job in live)] += 1
        self.busy_s += ended - began
        self.decode_ms = _mean(self.decode_ms, 1000 * (ended - began))
        self.last_decode_at = ended
        with self.cond:
            for job in live:
                self._count(self.account_of(job.session), job.rows)
            if self.aligning:
                self._mark_decoded([job.session.key for job in live], ended)
        for job, result in zip(live, results, strict=True):
            job.compute_ended = ended
            job.future.set_result(result)

    def _mark_decoded(self, keys: list[str], ended: float) -> None:
        """Notes when these sessions' decode steps ended, forgetting those that stopped
        decoding (called holding the lock)."""
        for key in keys:
            self.decoding.setdefault(key, Rhythm(ended)).ended = ended
        if len(self.decoding) > 2 * len(self.core.sessions) + len(keys):
            self.decoding = {k: r for k, r in self.decoding.items() if k in self.core.sessions}

    def _run_chunk(self, job: Job) -> None:
        """Runs the next chunk of a prefill and queues the rest again."""
        if not self._still_open(job):
            return
        part = job.hidden[:, job.done_tokens : job.done_tokens + self._chunk_tokens(job)]
        began = time.perf_counter()
        if job.done_tokens == 0:
            job.compute_started = began
        last = job.done_tokens + part.shape[1] >= job.hidden.shape[1]
        tokens = part.shape[0] * part.shape[1]
        try:
            job.outputs.append(self.core.run_chunk(job.session, part, last=last))
        except Exception as e:
            logger.exception("prefill chunk of session %s failed", job.session.session_id)
            self.core.end_step(job.session)
            job.future.set_exception(e)
            return
        self.busy_s += time.perf_counter() - began
        self.chunk_ms_per_token = _mean(
            self.chunk_ms_per_token, 1000 * (time.perf_counter() - began) / tokens
        )
        job.done_tokens += part.shape[1]
        with self.cond:
            self._count(self.account_of(job.session), tokens)
        if last:
            job.compute_ended = time.perf_counter()
            output = torch.cat(job.outputs, dim=1) if len(job.outputs) > 1 else job.outputs[0]
            job.future.set_result(StepResult(job.session.session_id, output))
        else:  # behind the jobs queued meanwhile: several prefills take turns
            with self.cond:
                self.queue.append(job)

    def _chunk_tokens(self, job: Job) -> int:
        """The next chunk's tokens: the policy's chunk, or while sessions are decoding, as many as
        take `interleave_ratio` x a decode batch's time (module docstring)."""
        chunk = self.policy.prefill_chunk_tokens or job.hidden.shape[1]
        decoding = time.perf_counter() - self.last_decode_at < DECODE_ACTIVE_S
        if not (decoding and self.policy.interleave_ratio and self.chunk_ms_per_token > 0):
            return chunk
        budget = self.policy.interleave_ratio * self.decode_ms / self.chunk_ms_per_token / job.rows
        return max(MIN_CHUNK_TOKENS, min(chunk, int(budget)))

    def _still_open(self, job: Job) -> bool:
        if self.core.sessions.get(job.session.key) is job.session:
            return True
        # Its stream is gone (closed, or the session expired): nobody waits for the answer.
        job.future.set_exception(
            ProtocolError(ErrorCode.UNKNOWN_SESSION, f"session {job.session.session_id} was closed")
        )
        return False


def _mean(running: float, sample: float) -> float:
    """An exponential running mean that starts at its first sample."""
    return sample if running <= 0 else (1 - EMA) * running + EMA * sample
