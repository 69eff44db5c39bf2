"""Admission limits on a live peer: a remote flooding it with session opens and steps gets
typed refusals, while another client's generation completes with exact output."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from hivemind.p2p import PeerID

from hexswarm.client.swarm_client import SwarmClient
from hexswarm.client.worker import event_loop, run_sync
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import SESSION_PROTOCOL, Error, ErrorCode, Open, Opened, Step, StepResult

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSIONS_PER_REMOTE = 3
# 5 steps/s with 2 s of burst: a fresh session may take 10 steps at once, so the honest
# generation (1 prefill + 7 decode steps) fits, and the flood (as fast as round trips go) does not.
STEPS_PER_SECOND = 5
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def limited(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama", layers=2, seed=21)
    with LocalSwarm(tmp_path_factory.mktemp("limits")) as local:
        local.start_bootstrap()
        local.start_peer(
            model_dir, "0:2", "limited", "--throughput", "100", "--decode-ms", "1",
            "--max-sessions", "12",
            "--max-sessions-per-peer", str(SESSIONS_PER_REMOTE),
            "--max-steps-per-second", str(STEPS_PER_SECOND),
        )  # fmt: skip
        yield local, model_dir


class Flooder:
    """A second remote (its own DHT node, so its own peer id) that floods the peer."""

    def __init__(self, initial_peers, model_id: str, peer_id: str):
        self.swarm = SwarmClient.connect(initial_peers, ("/ip4/127.0.0.1/tcp/0",))
        self.model_id, self.peer_id = model_id, PeerID.from_base58(peer_id)
        self.replies: list = []
        self.streams: list = []

    async def open_many(self, count: int) -> list:
        return await asyncio.gather(*(self._open(f"flood-{i}") for i in range(count)))

    async def _open(self, session_id: str):
        _, reader, writer = await self.swarm.p2p.call_binary_stream_handler(self.peer_id, SESSION_PROTOCOL)
        self.streams.append(writer)
        try:
            await write_frame(writer, Open(session_id, self.model_id, 0, 2, 512, 1, "float32"))
            reply = await asyncio.wait_for(read_frame(reader), 30)
        except (ConnectionError, asyncio.IncompleteReadError):
            return None
        return reply, reader, writer

    async def step_flood(self, reader, writer, session_id: str, stop: asyncio.Event) -> None:
        position = 0
        while not stop.is_set() and position < 500:
            await write_frame(writer, Step(session_id, position, torch.randn(1, 1, 128)))
            reply = await asyncio.wait_for(read_frame(reader), 30)
            self.replies.append(reply)
            position += isinstance(reply, StepResult)

    def close(self) -> None:
        async def go():
            for writer in self.streams:
                writer.close()

        run_sync(go(), timeout=10)
        self.swarm.shutdown()


def _per_token_ms(model, input_ids) -> tuple[torch.Tensor, float]:
    began = time.perf_counter()
    out = model.generate(input_ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    return out, 1000 * (time.perf_counter() - began) / NEW_TOKENS


def test_flooding_remote_is_refused_while_others_are_served(limited):
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM

    local, model_dir = limited
    reference = AutoModelForCausalLM.from_pretrained(model_dir)
    model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers)
    flooder = None
    try:
        input_ids = torch.tensor([[3, 14, 15, 92, 65]])
        expected = reference.generate(input_ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        out, quiet_ms = _per_token_ms(model, input_ids)
        assert torch.equal(out, expected)

        peer_id = next(r.peer_id for r in read_peer_records(model.swarm.dht, model.spec.model_id))
        flooder = Flooder(local.initial_peers, model.spec.model_id, peer_id)
        results = run_sync(flooder.open_many(20), timeout=120)
        replies = [r[0] for r in results if r is not None]
        admitted = [r for r in results if r is not None and isinstance(r[0], Opened)]
        refused = [r.code for r in replies if isinstance(r, Error)]
        assert len(admitted) == SESSIONS_PER_REMOTE, replies
        assert refused and set(refused) == {ErrorCode.REMOTE_LIMIT}, replies

        stop = asyncio.Event()
        floods = [
            asyncio.run_coroutine_threadsafe(
                flooder.step_flood(reader, writer, opened.session_id, stop), event_loop()
            )
            for opened, reader, writer in admitted
        ]
        # the flood has emptied its step bucket once the peer refuses its steps
        deadline = time.monotonic() + 30
        while not any(isinstance(r, Error) for r in list(flooder.replies)):
            assert time.monotonic() < deadline, "the flood was never refused a step"
            time.sleep(0.05)
        out, flooded_ms = _per_token_ms(model, input_ids)
        event_loop().call_soon_threadsafe(stop.set)
        for flood in floods:
            flood.result(60)
        assert torch.equal(out, expected)
        codes = {r.code for r in flooder.replies if isinstance(r, Error)}
        steps_done = sum(isinstance(r, StepResult) for r in flooder.replies)
        assert codes == {ErrorCode.RATE_LIMITED}, codes
        print(
            f"honest client: {quiet_ms:.1f} ms/token alone, {flooded_ms:.1f} ms/token under the flood; "
            f"flooder: {len(refused)} opens refused, {steps_done} steps served, "
            f"{len(flooder.replies) - steps_done} refused"
        )
    finally:
        if flooder is not None:
            flooder.close()
        model.shutdown()


def test_a_session_over_the_rate_is_paced_not_failed_over(limited):
    """A generation that outruns --max-steps-per-second: the peer refuses the steps over the rate
    with RATE_LIMITED, and the client waits the time named and sends them again. Nothing is
    banned or failed over (this swarm has no other peer to fail over to), the output is exact."""
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM

    local, model_dir = limited
    reference = AutoModelForCausalLM.from_pretrained(model_dir)
    model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers)
    try:
        input_ids = torch.tensor([[3, 14, 15, 92, 65]])
        new_tokens = 20  # 20 steps: the burst's 10, then 10 more at 5 steps/s, so 2 s at least
        expected = reference.generate(input_ids, max_new_tokens=new_tokens, do_sample=False)
        began = time.monotonic()
        out = model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False)
        assert torch.equal(out, expected)
        assert model.last_failovers == []
        assert time.monotonic() - began >= 1.5  # paced by the peer, not let through
    finally:
        model.shutdown()


def test_a_peer_full_for_this_client_is_routed_around_not_banned(limited):
    """Five generations at once from one client: the limited peer holds 3 sessions per remote,
    so at least two go to the other peer, by routing or after a REMOTE_LIMIT refusal. A refusal
    is back-pressure: nothing is banned, every output is exact."""
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM

    local, model_dir = limited
    roomy = local.start_peer(model_dir, "0:2", "roomy", "--throughput", "10", "--decode-ms", "20")
    reference = AutoModelForCausalLM.from_pretrained(model_dir)
    model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers)
    try:
        input_ids = torch.tensor([[3, 14, 15, 92, 65]])
        expected = reference.generate(input_ids, max_new_tokens=30, do_sample=False)

        def generate(_):
            return model.generate(input_ids, max_new_tokens=30, do_sample=False)

        with ThreadPoolExecutor(5) as pool:
            outputs = list(pool.map(generate, range(5)))
        assert all(torch.equal(out, expected) for out in outputs)
        assert not model.bans._failures, model.bans._failures  # full is no failure
    finally:
        model.shutdown()
        local.stop(roomy)
