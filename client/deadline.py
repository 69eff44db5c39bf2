"""Per-request deadlines from what a peer announced about its speed (pure, no I/O).

One fixed timeout is either too short for a long prefill on a slow peer or minutes too long
to notice a stalled (SIGSTOP'ed, swapped-out, partitioned) one. Peers announce how fast they
are (`decode_ms_per_block`: one token through one block; `throughput`: tokens/s through one
block in a batched prefill), so the client expects a step of T tokens x B sequences over n
blocks to take about

    compute_ms = n x max(decode_ms_per_block, 1000 x B x T / throughput)

and waits `slack` times that, times (1 + the peer's open sessions, which share its compute
thread), plus the measured round trip and the step's bytes at a slow home link's rate (a
relayed or internet hop), and never less than a floor. Each failure already
spent in the same call doubles it (up to x16), so a machine that is merely slow does not
turn every step into a failover.

With push between peers (peer/push.py) the client reads the hops' outputs in chain order, and
hop k's deadline runs from the arrival of hop k-1's output (about when hop k got the step),
plus the ack timeout when hop k pushes on: a pushed chain's step gets the sum of its hops'.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexswarm.client.retry import RetryPolicy


@dataclass(frozen=True)
class PeerSpeed:
    """What the client knows of a peer's speed (from its record and its own pings)."""

    decode_ms_per_block: float = 0.0
    throughput: float = 0.0  # tokens/s per block; 0 when unknown
    open_sessions: int = 0
    rtt_ms: float = 0.0


def step_deadline_s(
    speed: PeerSpeed,
    blocks: int,
    batch: int,
    tokens: int,
    policy: RetryPolicy,
    failures: int = 0,
    payload_bytes: int = 0,
) -> float:
    """Seconds to wait for one step's reply before calling the peer stalled; `payload_bytes`
    (sent and received) adds its transfer at the policy's slowest link."""
    per_block_ms = max(speed.decode_ms_per_block, 0.0)
    if speed.throughput > 0:
        per_block_ms = max(per_block_ms, 1000.0 * batch * tokens / speed.throughput)
    compute_ms = blocks * per_block_ms * (1 + max(speed.open_sessions, 0))
    expected_s = (policy.deadline_slack * compute_ms + max(speed.rtt_ms, 0.0)) / 1000.0
    expected_s += transfer_s(payload_bytes, policy)
    return max(policy.deadline_floor_s, expected_s) * 2 ** min(max(failures, 0), 4)


def transfer_s(payload_bytes: int, policy: RetryPolicy) -> float:
    """Seconds `payload_bytes` take at the slowest link the policy allows for."""
    return max(payload_bytes, 0) / policy.min_link_bytes_per_s
