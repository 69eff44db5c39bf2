"""The announcer stores the record every period and the models entry every INDEX_PERIODS-th."""

import asyncio

from hexswarm.peer.announcer import Announcer
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.trust.record_keys import INDEX_PERIODS, MODEL_INDEX_KEY, IndexSchedule
from hexswarm.swarm.trust.records import PeerState
from tests.unit.record_cases import make_record


class Stores(Announcer):
    """An announcer whose stores are noted (and answered with `taken`), not sent to a DHT."""

    def __init__(self, tmp_path):
        super().__init__(
            None,
            load_or_create_identity(tmp_path / "id.key"),
            lambda state: make_record(state=state),
            4,
            15.0,
        )
        self.stored: list[tuple[str, float]] = []
        self.taken = True

    async def _store(self, key: str, value: bytes, expiration: float, subkey: bytes) -> bool:
        self.stored.append((key, expiration))
        return self.taken


def index_stores(announcer: Stores) -> list[float]:
    return [at for key, at in announcer.stored if key.startswith(MODEL_INDEX_KEY)]


def test_the_models_entry_goes_with_every_fourth_record_and_lasts_that_much_longer(tmp_path):
    announcer = Stores(tmp_path)
    for _ in range(2 * INDEX_PERIODS):
        asyncio.run(announcer.announce(PeerState.ONLINE))
    records = [at for key, at in announcer.stored if not key.startswith(MODEL_INDEX_KEY)]
    assert len(records) == 2 * INDEX_PERIODS and len(index_stores(announcer)) == 2
    first_index, first_record = index_stores(announcer)[0], records[0]
    assert abs(first_index - first_record - (INDEX_PERIODS - 1) * 15.0) < 1e-6


def test_a_models_entry_no_node_took_is_stored_again_at_the_next_announcement(tmp_path):
    announcer = Stores(tmp_path)
    announcer.taken = False
    asyncio.run(announcer.announce(PeerState.ONLINE))
    announcer.taken = True
    asyncio.run(announcer.announce(PeerState.ONLINE))
    asyncio.run(announcer.announce(PeerState.ONLINE))
    assert len(index_stores(announcer)) == 2  # the failed one, then the next; not the third


def test_the_index_schedule_is_every_fourth_announcement_and_retries_an_untaken_entry():
    schedule = IndexSchedule()
    carried = []
    for n in range(3 * INDEX_PERIODS):
        due = schedule.due()
        carried.append(due)
        if due and n != 0:  # the first one reached no node
            schedule.taken()
    assert [n for n, due in enumerate(carried) if due] == [0, 1, 1 + INDEX_PERIODS, 1 + 2 * INDEX_PERIODS]
