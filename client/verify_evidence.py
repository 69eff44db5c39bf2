"""What a client keeps and says of a proven lie (client/verify.py): the liar's signed commitments
with the inputs, saved for `hexswarm recheck` (swarm/trust/evidence.py), and the signed report
it publishes in the DHT (swarm/trust/reports.py)."""

from __future__ import annotations

import asyncio
import logging

from hivemind.utils import get_dht_time

from hexswarm.client.remote import PeerError
from hexswarm.client.verify_records import Run, Served
from hexswarm.swarm.net.identity import peer_id_from_owner_marker
from hexswarm.swarm.trust.evidence import Evidence, save_evidence
from hexswarm.swarm.trust.reports import REPORT_TTL_S, Report, publish_report

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 5.0


async def evidence_of_lie(bad: Served, run: Run) -> Evidence | None:
    """The liar's signed commitments and the inputs, saved where `hexswarm recheck` reads
    them; None if it signs nothing (an older peer) or will not sign now."""
    log = bad.conn.logs.get(bad.session_id) if bad.conn is not None else None
    if log is not None and log.rolled_back:
        logger.info(
            "no evidence file against %s: its session rolled back drafts, which its commitments "
            "cover and the client no longer keeps (docs/speculation.md)",
            bad.conn.peer_name,
        )
        return None
    end = bad.position + bad.output.shape[1]
    step = next((i for i, r in enumerate(log.records) if r.position == end), None) if log else None
    if step is None or not bad.conn.owner_marker:
        return None
    try:
        signed = log.signed_after(end) or await bad.conn.attest(bad.session_id)
    except PeerError as e:
        logger.info("peer %s signs no statement of its wrong output: %s", bad.conn.peer_name, e)
        return None
    records = tuple(r for r in log.records if r.position <= signed.position)
    inputs = run.inputs[:, :end].contiguous()
    evidence = Evidence(
        log.session, bad.peer_id, bad.conn.owner_marker, records, signed, step, inputs, bad.output
    )
    try:
        evidence.check()
    except ValueError as e:  # ours must hold together; if not, say so rather than publish it
        logger.warning("evidence against %s does not hold together: %s", bad.conn.peer_name, e)
        return None
    path = await asyncio.to_thread(save_evidence, evidence)
    logger.warning("evidence saved to %s (hexswarm recheck re-checks it)", path)
    return evidence


async def publish_report_signed(dht, report: Report) -> None:
    """Publishes `report` under this process's DHT key, as its reporter; a DHT that does not
    answer in time is logged (the ban holds anyway)."""
    from hivemind.dht.crypto import RSASignatureValidator

    marker = RSASignatureValidator().local_public_key  # the key this process's DHT node signs with
    report = Report(**{**report.__dict__, "reporter": peer_id_from_owner_marker(marker).to_base58()})
    future = publish_report(dht, marker, report, get_dht_time() + REPORT_TTL_S)
    try:
        await asyncio.wait_for(asyncio.wrap_future(future), PUBLISH_TIMEOUT_S)
    except Exception as e:  # the ban holds even if the DHT is unreachable
        logger.warning("could not publish the report on %s: %s", report.reported, type(e).__name__)
