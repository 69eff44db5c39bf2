"""Every synchronous DHT read of the client, `hexswarm status` and the monitor has a deadline,
and so has starting a DHT node.

The reader's own DHT process is stopped (SIGSTOP): hivemind's plain `dht.get` would then wait
for good. Each reader must come back empty, within its timeout, and say so in the log.

A DHT node sends its results (its readiness first) through one pipe to its owner, under a lock
that all DHT children of one owner share (hivemind's `MPFuture._update_lock`). A child stopped
while holding it used to leave it held for good, and the owner's next DHT node then waited
forever to start (a CI run's `test_tp_move.py` timed out that way).
"""

import faulthandler
import logging
import os
import signal
import threading
import time
from contextlib import contextmanager

import pytest

from hexswarm.client.swarm_client import MIN_READ_TIMEOUT_S, MissingBlocksError, SwarmClient
from hexswarm.swarm.coordinator.records import read_coordination_sync
from hexswarm.swarm.net.dht import DHTStartError, start_dht
from hexswarm.swarm.net.dht_process import child_pids, shutdown_dht
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.record_keys import MODEL_INDEX_KEY
from hexswarm.swarm.trust.records import read_models, read_peer_records
from hexswarm.swarm.trust.reports import read_reports
from tests.integration.test_coordinator import wait_until

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 1.0
SLACK_S = 1.5  # scheduling on a loaded 2-core machine


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """A real bootstrap node's addresses."""
    with LocalSwarm(tmp_path_factory.mktemp("deadlines")) as local:
        yield local.start_bootstrap()


@pytest.fixture(scope="module")
def reader(bootstrap):
    """A client-mode DHT node joined to the bootstrap node."""
    dht = start_dht(bootstrap, identity=None, client_mode=True, listen=False)
    try:
        yield dht
    finally:
        shutdown_dht(dht, 5)


@contextmanager
def frozen(dht):
    """The DHT's process stopped (it started as our child), so nothing it is asked is answered."""
    os.kill(dht.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(dht.pid, signal.SIGCONT)


def timed(call):
    began = time.monotonic()
    result = call()
    return result, time.monotonic() - began


def test_a_frozen_dht_really_does_not_answer(reader):
    """The control: without a deadline of ours, the read below would wait for good."""
    with frozen(reader), pytest.raises(TimeoutError):
        reader.get(MODEL_INDEX_KEY, latest=True, return_future=True).result(timeout=READ_TIMEOUT_S)


@pytest.mark.parametrize(
    "read, keys",
    [
        (lambda dht: read_models(dht, READ_TIMEOUT_S), 1),
        (lambda dht: read_peer_records(dht, "some-model", READ_TIMEOUT_S), 1),
        (lambda dht: read_reports(dht, "some-model", READ_TIMEOUT_S), 1),
        (lambda dht: read_coordination_sync(dht, "some-model", READ_TIMEOUT_S).holder, 2),
        (lambda dht: SwarmClient(dht=dht, p2p=None).online_records("some-model", 4, READ_TIMEOUT_S), 1),
    ],
    ids=["models", "peer_records", "reports", "coordination", "client_records"],
)
def test_a_read_of_a_frozen_dht_comes_back_empty_in_time(reader, read, keys, caplog):
    caplog.set_level(logging.WARNING, logger="hexswarm.swarm.net.dht_read")
    with frozen(reader):
        result, took = timed(lambda: read(reader))
    assert not result
    assert took < keys * READ_TIMEOUT_S + SLACK_S, took
    assert "did not answer" in caplog.text


def test_waiting_for_coverage_ends_by_its_deadline_when_the_dht_is_frozen(reader):
    client = SwarmClient(dht=reader, p2p=None)
    began = time.monotonic()
    with frozen(reader), pytest.raises(MissingBlocksError):
        client.wait_for_coverage("some-model", 4, timeout=2.0)
    # the reads near the deadline (the mismatch check's two) still get MIN_READ_TIMEOUT_S each
    assert time.monotonic() - began < 2.0 + 2 * MIN_READ_TIMEOUT_S + SLACK_S


def test_a_read_after_the_dht_thaws_answers_again(reader):
    with frozen(reader):
        read_models(reader, READ_TIMEOUT_S)
    result, took = timed(lambda: read_models(reader, 10))
    assert result == {} and took < 5, took


@contextmanager
def update_lock_held():
    """hivemind's lock on the pipe that carries DHT results to this process, held here."""
    from hivemind.utils.mpfuture import MPFuture

    if not MPFuture._update_lock.acquire(timeout=5):
        pytest.fail("the DHT result lock was already held (by a DHT child stopped mid-send?)")
    try:
        yield
    finally:
        MPFuture._update_lock.release()


def test_a_dht_node_that_cannot_say_it_is_ready_is_stopped_by_its_start_deadline(bootstrap):
    from hivemind.utils.mpfuture import MPFuture

    MPFuture()  # its shared state starts torch's memory manager, a child process of its own
    before = set(child_pids(os.getpid()))
    began = time.monotonic()
    with update_lock_held(), pytest.raises(DHTStartError, match="did not start within 2 s"):
        start_dht(bootstrap, identity=None, client_mode=True, listen=False, start_timeout=2)
    assert time.monotonic() - began < 2 + 5 + SLACK_S  # the deadline, then the bounded shutdown
    assert set(child_pids(os.getpid())) <= before, "the DHT process that did not start is still running"


def test_a_dht_node_stopped_while_sending_a_result_finishes_the_send_first(bootstrap):
    """SIGTERM reaches the node while it holds the result lock (its owner stopped reading, so
    the pipe is full): it exits only once the send is done, and the next node starts."""
    from hivemind.utils.mpfuture import MPFuture

    dht = start_dht(bootstrap, identity=None, client_mode=True, listen=False)
    owner_reads, owner_stalled = threading.Event(), threading.Event()

    def stall_the_owners_reader(_future):
        if threading.current_thread() is not threading.main_thread():  # the result receiver
            owner_stalled.set()
            owner_reads.wait(60)

    pending = []  # futures nobody holds are dropped unanswered, their callbacks with them
    try:
        while not owner_stalled.is_set():  # a result that came before the callback was added
            pending.append(dht.run_coroutine(_nothing, return_future=True))
            pending[-1].add_done_callback(stall_the_owners_reader)
            owner_stalled.wait(1)
        pending.append(dht.run_coroutine(_more_than_a_pipe_holds, return_future=True))
        wait_until(lambda: _held_by_another_process(MPFuture._update_lock), 30, "the node holding the lock")
        os.kill(dht.pid, signal.SIGTERM)
        dht.join(1.0)
        assert dht.is_alive(), "the node exited while it held the result lock"
    finally:
        owner_reads.set()
    dht.join(10)
    assert not dht.is_alive(), "the node did not exit once its send was done"
    del pending
    with update_lock_held():
        pass
    shutdown_dht(start_dht(bootstrap, identity=None, client_mode=True, listen=False, start_timeout=30), 5)


async def _nothing(_dht, _node) -> None:
    return None


async def _more_than_a_pipe_holds(_dht, _node) -> bytes:
    return bytes(1 << 17)  # a pipe holds 64 KiB


def _held_by_another_process(lock) -> bool:
    if lock.acquire(timeout=0.2):
        lock.release()
        return False
    return True


def test_a_dht_node_whose_process_dies_as_it_starts_is_started_once_more(
    bootstrap, monkeypatch, tmp_path, caplog
):
    """A child forked from a process whose threads ran torch can abort at its first torch call
    (SIGABRT, seen in a full test run): the start notices at once (not after its 60 s
    deadline) and forks one more child; a second death is a DHTStartError."""
    from hexswarm.swarm.net import dht_process

    deaths = tmp_path / "deaths"
    real_run = dht_process.OwnedDHT.run

    def run_dying_first(self):  # in the child
        if not deaths.exists():
            deaths.write_text("1")
            faulthandler.disable()  # no traceback dump in the test's output: the abort is meant
            os.abort()
        real_run(self)

    monkeypatch.setattr(dht_process.OwnedDHT, "run", run_dying_first)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hexswarm.swarm.net.dht"):
        dht = start_dht(bootstrap, None, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        assert time.monotonic() - began < 20
        assert "ended as it started" in caplog.text and "starting it once more" in caplog.text
        assert dht.is_alive()
    finally:
        shutdown_dht(dht, 5.0)

    def run_dying(self):
        faulthandler.disable()
        os.abort()

    monkeypatch.setattr(dht_process.OwnedDHT, "run", run_dying)
    with pytest.raises(DHTStartError, match="ended as it started"):
        start_dht(bootstrap, None, host_maddrs=["/ip4/127.0.0.1/tcp/0"])


def test_the_dht_child_collects_none_of_the_objects_it_inherits(bootstrap, monkeypatch, tmp_path):
    """What aborted a child twice in a row in one full run: its cycle collector finalizing what
    the parent's other threads held. Every object it inherits is frozen (gc.freeze) at the fork,
    and the parent's are collected again once the child is started."""
    import gc

    from hexswarm.swarm.net import dht_process

    frozen = tmp_path / "frozen"
    real_run = dht_process.OwnedDHT.run

    def run_counting(self):  # in the child
        frozen.write_text(str(gc.get_freeze_count()))
        real_run(self)

    monkeypatch.setattr(dht_process.OwnedDHT, "run", run_counting)
    before = gc.get_freeze_count()
    dht = start_dht(bootstrap, None, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        assert int(frozen.read_text()) > before + 1000  # the parent's objects, out of the child's reach
        assert gc.get_freeze_count() == before
    finally:
        shutdown_dht(dht, 5.0)
