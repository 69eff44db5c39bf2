"""The coordinator's DHT records: the lease (who coordinates a model) and the plan (what to serve).

Layout, signed like peer records (swarm/trust/records.py): each writer owns one subkey protected by
its key, and readers drop entries whose stated peer id is not the signer's.

    hexswarm/v1/coordinator/<model_id>  subkey [owner:<key>]  ->  msgpack Lease   (one per candidate)
    hexswarm/v1/plans/<model_id>        subkey [owner:<key>]  ->  msgpack PlanRecord

The lease holder is the live claim with the earliest `since` (ties: smallest peer id), so every
reader that sees the same claims agrees on one holder, and a candidate that claimed at the same
moment as another one sees that it lost and stops renewing. A claim lives until its DHT
expiration: a holder that vanishes stops renewing and its claim expires.

Whom to believe. A claimant writes its own `since`, and a plan's author its own `version`, so
neither can decide between strangers: a claim with `since = 0` would win for good, and a plan
numbered 2**62 would make followers ignore every later one. Readers therefore count only the
claims and plans signed by *trusted* coordinator keys (`Trust`): the peer ids the swarm's
operator names with `--coordinator-key`. With none named, a private swarm trusts any member
(whoever can reach its bootstrap was let in by its operator) and the public swarm trusts none
(its `--layers auto` peers follow Petals' rule). Versions are bounded (`MAX_PLAN_VERSION`).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import msgpack

from hexswarm.routing.scheduler.model_spec import OBJECTIVES
from hexswarm.swarm.net.dht_read import dht_get, get_latest
from hexswarm.swarm.trust.records import ROLES, block_ranges, parse_signed_entries, unpack_map, warn_once

logger = logging.getLogger(__name__)

COORDINATION_SCHEMA_VERSION = 1
LEASE_KEY = "hexswarm/v1/coordinator"
PLAN_KEY = "hexswarm/v1/plans"
MAX_ASSIGNMENTS = 1024
MAX_BLOCKS = 4096  # most blocks a plan may name as missing (and the largest block index)
MAX_PLAN_VERSION = 1 << 31  # one plan a second for 68 years; larger versions are refused

# The coordinator keys (base58 peer ids) whose leases and plans count; None: any signed one.
Trust = frozenset[str] | None


def trust_from(keys: list[str] | None, public: bool = False) -> Trust:
    """The trust of `--coordinator-key KEY ...`: those keys; with none, any member of a private
    swarm and nobody in a public one (`--public`: run-peer passes the keys its shipped list
    names). ValueError on a key that is not a peer id."""
    from hivemind.p2p import PeerID

    if keys:
        for key in keys:
            try:
                PeerID.from_base58(key)
            except Exception:
                raise ValueError(f"--coordinator-key {key!r} is not a peer id (base58)") from None
        return frozenset(keys)
    return frozenset() if public else None


def trust_text(trust: Trust) -> str:
    if trust is None:
        return "any coordinator of this private swarm"
    if not trust:
        return "no coordinator (name one with --coordinator-key)"
    return "coordinator keys " + ", ".join(sorted(key[-8:] for key in trust))


class CoordinationRecordError(ValueError):
    """A lease or plan record that is malformed, forged or of another schema."""


def lease_key(model_id: str) -> str:
    return f"{LEASE_KEY}/{model_id}"


def plan_key(model_id: str) -> str:
    return f"{PLAN_KEY}/{model_id}"


@dataclass(frozen=True)
class Lease:
    """A candidate's claim to coordinate `model_id`, renewed while it runs."""

    model_id: str
    holder: str  # base58 peer id; must be the signer's
    since: float  # DHT time the claim was first made; kept on renewals
    schema: int = COORDINATION_SCHEMA_VERSION
    released: bool = False  # the holder stopped (SIGTERM): the claim no longer counts

    def to_bytes(self) -> bytes:
        body = {"model_id": self.model_id, "holder": self.holder, "since": self.since, "schema": self.schema}
        if self.released:
            body["released"] = True
        return msgpack.packb(body, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> Lease:
        body = _body(data)
        model_id, holder, since = body.get("model_id"), body.get("holder"), body.get("since")
        released = body.get("released", False)
        if not isinstance(model_id, str) or not isinstance(holder, str) or not _is_number(since):
            raise CoordinationRecordError("malformed lease")
        if not 0 <= since < 1e12:  # NaN fails too
            raise CoordinationRecordError(f"lease since {since!r} out of range")
        if not isinstance(released, bool):
            raise CoordinationRecordError("malformed lease release")
        return cls(model_id, holder, float(since), released=released)

    @property
    def rank(self) -> tuple[float, str]:
        return (self.since, self.holder)


@dataclass(frozen=True)
class Assignment:
    """One peer's part of a plan: serve blocks [start, end) as a tensor-parallel group of `tp`,
    in role `role` (a disaggregated plan's prefill or decode; "both" otherwise)."""

    peer_id: str
    start: int
    end: int
    tp: int = 1
    role: str = "both"


@dataclass(frozen=True)
class PlanRecord:
    """A plan for one model, as the lease holder published it."""

    model_id: str
    version: int  # strictly increasing across coordinators
    coordinator: str  # peer id of the lease holder that signed it
    inputs_hash: str  # hash of the inputs it was computed from (see `inputs_hash`)
    attainment: float  # the scheduler's estimated SLO attainment (0..1)
    throughput_tok_s: float  # its estimated tokens/s at the planned rate
    assignments: tuple[Assignment, ...]
    created: float = 0.0  # DHT time
    schema: int = COORDINATION_SCHEMA_VERSION
    # "slo" (attainment is the share within the deadline) or "throughput" (planned with no
    # deadline for the most tokens/s at a saturating rate; attainment is then 1, nobody is late)
    objective: str = "slo"
    # Blocks no peer serves under this plan (empty: it covers the model; the coordinator publishes
    # one that does not only when no covering plan exists), and how many more blocks the peers
    # would need to hold between them for one.
    missing: tuple[int, ...] = ()
    memory_short_blocks: int = 0

    def assignment_of(self, peer_id: str) -> Assignment | None:
        return next((a for a in self.assignments if a.peer_id == peer_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "version": self.version,
            "coordinator": self.coordinator,
            "inputs_hash": self.inputs_hash,
            "attainment": self.attainment,
            "throughput_tok_s": self.throughput_tok_s,
            # the role only where it is not "both", so plans without roles read as before
            "assignments": [
                [a.peer_id, a.start, a.end, a.tp, *([a.role] if a.role != "both" else [])]
                for a in self.assignments
            ],
            "created": self.created,
            "schema": self.schema,
            "objective": self.objective,
            "missing": list(self.missing),
            "memory_short_blocks": self.memory_short_blocks,
        }

    def to_bytes(self) -> bytes:
        return msgpack.packb(self.to_dict(), use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> PlanRecord:
        body = _body(data)
        strings = [body.get(k) for k in ("model_id", "coordinator", "inputs_hash")]
        numbers = [body.get(k) for k in ("attainment", "throughput_tok_s", "created")]
        version, raw = body.get("version"), body.get("assignments")
        if not all(isinstance(s, str) for s in strings) or not all(_is_number(n) for n in numbers):
            raise CoordinationRecordError("malformed plan")
        if not _is_int(version) or not 1 <= version <= MAX_PLAN_VERSION:
            raise CoordinationRecordError(f"plan version must be in 1..{MAX_PLAN_VERSION}")
        if not isinstance(raw, list) or len(raw) > MAX_ASSIGNMENTS:
            raise CoordinationRecordError("plan assignments malformed")
        objective = body.get("objective", "slo")  # records of earlier versions have none
        if objective not in OBJECTIVES:
            raise CoordinationRecordError("unknown plan objective")
        assignments = tuple(_assignment(item) for item in raw)
        if len({a.peer_id for a in assignments}) != len(assignments):
            raise CoordinationRecordError("a peer appears twice in a plan")
        missing, short = body.get("missing", []), body.get("memory_short_blocks", 0)  # absent before
        if (
            not isinstance(missing, list)
            or len(missing) > MAX_BLOCKS
            or not all(_is_block(b) for b in missing)
        ):
            raise CoordinationRecordError("a plan's missing blocks are malformed")
        if not _is_int(short) or not 0 <= short <= MAX_BLOCKS:
            raise CoordinationRecordError("a plan's memory shortfall is malformed")
        return cls(
            strings[0],
            version,
            strings[1],
            strings[2],
            *map(float, numbers[:2]),
            assignments,
            float(numbers[2]),
            objective=objective,
            missing=tuple(missing),
            memory_short_blocks=short,
        )


def uncovered_text(missing: tuple[int, ...] | list[int], memory_short_blocks: int) -> str:
    """What a plan that cannot cover the model leaves out (the coordinator's log and `hexswarm
    status` say it so; the monitor's page words it the same)."""
    short = (
        f"; the peers can hold {memory_short_blocks} blocks too few between them"
        if memory_short_blocks
        else ""
    )
    return f"blocks {block_ranges(list(missing))} have no peer{short}"


def _assignment(item: Any) -> Assignment:
    if not isinstance(item, list) or len(item) not in (4, 5) or not isinstance(item[0], str):
        raise CoordinationRecordError("an assignment is not [peer id, start, end, tp(, role)]")
    if not all(_is_int(x) for x in item[1:4]) or not 0 <= item[1] < item[2] or item[3] < 1:
        raise CoordinationRecordError(f"bad assignment {str(item)[:200]}")
    if len(item) == 5 and item[4] not in ROLES:
        raise CoordinationRecordError(f"unknown role in assignment {str(item)[:200]}")
    return Assignment(*item)


def _body(data: Any) -> dict:
    try:
        body = unpack_map(data)
    except ValueError as e:
        raise CoordinationRecordError(str(e)) from None
    if body.get("schema") != COORDINATION_SCHEMA_VERSION:
        raise CoordinationRecordError(f"schema {body.get('schema')!r} is not {COORDINATION_SCHEMA_VERSION}")
    return body


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_block(x: Any) -> bool:
    return _is_int(x) and 0 <= x < MAX_BLOCKS


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def inputs_hash(parts: Any) -> str:
    """A short hash of the plan's inputs (msgpack of plain data), to tell plans apart in status."""
    return hashlib.sha256(msgpack.packb(parts, use_bin_type=True)).hexdigest()[:16]


def current_holder(leases: list[tuple[str, Lease]], model_id: str) -> Lease | None:
    """The lease holder among live signed claims [(signer, lease)]; forged claims are logged and dropped."""
    valid = []
    for signer, lease in leases:
        if lease.holder != signer or lease.model_id != model_id:
            logger.warning("ignoring a forged lease: claims holder %s, signed by %s", lease.holder, signer)
            continue
        if not lease.released:
            valid.append(lease)
    return min(valid, key=lambda lease: lease.rank, default=None)


def plans_from(entries: list[tuple[str, PlanRecord]], model_id: str) -> list[PlanRecord]:
    """Plans whose stated coordinator signed them (others are logged and dropped)."""
    plans = []
    for signer, plan in entries:
        if plan.coordinator != signer or plan.model_id != model_id:
            logger.warning(
                "ignoring a forged plan v%d: claims %s, signed by %s", plan.version, plan.coordinator, signer
            )
            continue
        plans.append(plan)
    return plans


def latest_plan_of(plans: list[PlanRecord], holder: Lease | None) -> PlanRecord | None:
    """The holder's newest plan; plans signed by anyone else are not followed."""
    if holder is None:
        return None
    own = [p for p in plans if p.coordinator == holder.holder]
    return max(own, key=lambda p: p.version, default=None)


def trusted_only(entries: list[tuple[str, Any]], trust: Trust, what: str) -> list[tuple[str, Any]]:
    """The (signer, entry) pairs signed by a trusted coordinator key; others are logged once."""
    if trust is None:
        return entries
    for signer, _ in entries:
        if signer not in trust:
            warn_once(signer, f"ignoring a {what} signed by ...{signer[-8:]}: not a trusted coordinator key")
    return [(signer, entry) for signer, entry in entries if signer in trust]


async def read_leases(
    dht, model_id: str, trust: Trust = None, every_node: bool = True
) -> list[tuple[str, Lease]]:
    entries = parse_signed_entries(
        await dht_get(dht, lease_key(model_id), every_node=every_node), Lease.from_bytes
    )
    return trusted_only(entries, trust, "coordinator lease")


async def read_plans(dht, model_id: str, trust: Trust = None, every_node: bool = True) -> list[PlanRecord]:
    entries = parse_signed_entries(
        await dht_get(dht, plan_key(model_id), every_node=every_node), PlanRecord.from_bytes
    )
    return plans_from(trusted_only(entries, trust, "plan"), model_id)


@dataclass(frozen=True)
class Coordination:
    """What a reader of the DHT knows about a model's coordination right now."""

    holder: Lease | None
    plan: PlanRecord | None  # the holder's newest plan
    newest_version: int  # the highest version of any signed plan (a new holder continues from it)
    others: tuple[PlanRecord, ...] = ()  # signed plans of non-holders: never followed


def coordination_from(
    leases: list[tuple[str, Lease]], plans: list[PlanRecord], model_id: str
) -> Coordination:
    holder = current_holder(leases, model_id)
    newest = max((p.version for p in plans), default=0)
    others = tuple(p for p in plans if holder is None or p.coordinator != holder.holder)
    return Coordination(holder, latest_plan_of(plans, holder), newest, others)


async def read_coordination(dht, model_id: str, trust: Trust = None, every_node: bool = True) -> Coordination:
    """The lease holder and plans now. `every_node` False asks only the nodes nearest each key
    (swarm/net/dht_read.py), for a watch that runs every second."""
    leases = await read_leases(dht, model_id, trust, every_node)
    plans = await read_plans(dht, model_id, trust, every_node)
    return coordination_from(leases, plans, model_id)


def read_coordination_sync(
    dht, model_id: str, timeout: float | None = None, trust: Trust = None
) -> Coordination:
    """`read_coordination` for synchronous callers (`hexswarm status`, the monitor); each of its
    two reads waits at most `timeout` seconds (swarm.net.dht_read.DHT_READ_TIMEOUT_S), and a read
    that does not finish in time counts as no entries."""
    leases = parse_signed_entries(get_latest(dht, lease_key(model_id), timeout), Lease.from_bytes)
    entries = parse_signed_entries(get_latest(dht, plan_key(model_id), timeout), PlanRecord.from_bytes)
    leases, entries = trusted_only(leases, trust, "coordinator lease"), trusted_only(entries, trust, "plan")
    return coordination_from(leases, plans_from(entries, model_id), model_id)
