"""Every synchronous DHT read of the client, `hexswarm status` and the monitor has a deadline.

The reader's own DHT process is stopped (SIGSTOP): hivemind's plain `dht.get` would then wait
for good. Each reader must come back empty, within its timeout, and say so in the log.
"""

import logging
import os
import signal
import time
from contextlib import contextmanager

import pytest

from hexswarm.client.swarm_client import MIN_READ_TIMEOUT_S, MissingBlocksError, SwarmClient
from hexswarm.swarm.coordinator.records import read_coordination_sync
from hexswarm.swarm.net.dht import start_dht
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import MODELS_KEY, read_models, read_peer_records
from hexswarm.swarm.trust.reports import read_reports

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 1.0
SLACK_S = 1.5  # scheduling on a loaded 2-core machine


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    """A client-mode DHT node joined to a real bootstrap node."""
    with LocalSwarm(tmp_path_factory.mktemp("deadlines")) as local:
        dht = start_dht(local.start_bootstrap(), identity=None, client_mode=True, listen=False)
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
        reader.get(MODELS_KEY, latest=True, return_future=True).result(timeout=READ_TIMEOUT_S)


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
