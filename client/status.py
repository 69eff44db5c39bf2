"""`hexswarm status`: the peers of a swarm and the block coverage of each model.

A record says what a peer claims; status also pings every peer announced online, the way a
client would (at the record's addresses, through its relays), and counts only those that
answer: a peer reachable only through a relay that died is shown as not answering, with why.
Exits 0 when every block of every listed model has an online peer that answered (with
--no-ping: that announces itself online), 1 otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.net.dht_read import DHT_READ_TIMEOUT_S
from hexswarm.swarm.tools.terminal_text import printable

if TYPE_CHECKING:  # hivemind loads when the command runs, not for --help
    from hexswarm.swarm.coordinator.records import Coordination
    from hexswarm.swarm.trust.records import PeerRecord
    from hexswarm.swarm.trust.reports import Report

EXIT_AT_ONCE = True  # run() stops the DHT (and the client) it starts: swarm.commands.cli.exit_at_once
# Peer-supplied text is escaped (swarm.tools.terminal_text) and cut to these lengths, in characters.
MODEL_ID_LIMIT = 120
ADDRESS_LIMIT = 80


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_initial_peers(parser)
    cli_args.add_model_argument(parser, required=False)
    parser.add_argument("--json", action="store_true", help="print the same as JSON data")
    parser.add_argument(
        "--coordinator-key",
        nargs="+",
        default=None,
        metavar="PEER_ID",
        help="show the lease and plans of these coordinator keys only, as peers that trust them see it "
        "(default: any member of the swarm)",
    )
    parser.add_argument(
        "--no-ping",
        action="store_true",
        help="trust the records: do not ping the peers (faster, but a peer whose relay died still looks online)",
    )
    parser.add_argument(
        "--timeout",
        type=cli_args.positive_float,
        default=DHT_READ_TIMEOUT_S,
        help="seconds each DHT read may take; a read that takes longer counts as no entries",
    )


def run(args: argparse.Namespace) -> int:
    # Peers write the names and labels printed here; what this terminal cannot encode is shown
    # as an escape rather than raising halfway through the table.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")
    watched = None if args.model is None else dict([cli_args.model_identity(args.model)])

    from hexswarm.client.monitor_data import model_entry
    from hexswarm.client.swarm_client import SwarmClient
    from hexswarm.swarm.coordinator.records import read_coordination_sync, trust_from
    from hexswarm.swarm.models.builtin_models import builtin_names
    from hexswarm.swarm.trust import speed_reports
    from hexswarm.swarm.trust.records import read_models, read_peer_records
    from hexswarm.swarm.trust.reports import read_reports

    try:
        trust = trust_from(args.coordinator_key)
    except ValueError as e:
        raise cli_args.UsageError(str(e)) from None
    swarm = SwarmClient.connect(args.initial_peers)
    dht = swarm.dht
    try:
        models = read_models(dht, args.timeout) if watched is None else watched
        if not models and not args.json:
            print("no models are announced in this swarm")
            return 1
        complete, report = bool(models), []
        aliases = {} if args.json else builtin_names()  # read once: a cache lookup per built-in
        for model_id, num_blocks in sorted(models.items()):
            records = read_peer_records(dht, model_id, args.timeout)
            silent = {} if args.no_ping else not_answering(swarm, records, args.timeout)
            coordination = read_coordination_sync(dht, model_id, args.timeout, trust)
            reports = read_reports(dht, model_id, args.timeout)
            observed = speed_reports.combine(speed_reports.read(dht, model_id, args.timeout))
            if args.json:
                rtts = {p: ms for p, (ms, _) in swarm.rtt_ms.items()}
                entry = model_entry(model_id, num_blocks, records, rtts, coordination, observed, silent)
                entry["reports"] = [asdict(r) for r in reports]
                report.append(entry)  # the monitor's shape
                complete &= all(entry["coverage"])
            else:
                complete &= print_model(model_id, num_blocks, records, aliases.get(model_id), silent)
                print_over_announcers(records, observed)
                print_plan(coordination, records)
                print_reports(reports, {r.peer_id: r.name for r in records})
        if args.json:
            print(json.dumps({"models": report}, indent=2))
        return 0 if complete else 1
    finally:
        swarm.shutdown()


def not_answering(swarm, records: list[PeerRecord], timeout: float) -> dict[str, str]:
    """Peer id -> why it did not answer a ping, of the records announced online."""
    from hexswarm.swarm.trust.records import PeerState

    online = [r for r in records if r.state == PeerState.ONLINE]
    answered = swarm.round_trips(online, timeout)
    return {
        r.peer_id: swarm.ping_errors.get(r.peer_id, "no answer") for r in online if r.peer_id not in answered
    }


def print_model(
    model_id: str,
    num_blocks: int,
    records: list[PeerRecord],
    alias: str | None = None,
    silent: dict[str, str] | None = None,
) -> bool:
    """Prints the peer table and coverage line of one model (`alias`: the name users type for it;
    `silent`: peers announced online that did not answer, and why); True if every block has an
    online peer that answered."""
    silent = silent or {}
    print(f"model {printable(model_id, MODEL_ID_LIMIT)}{f' ({alias})' if alias else ''}: {num_blocks} blocks")
    print(
        f"  {'peer id':<14} {'name':<16} {'layers':<9} {'role':<7} {'state':<8} {'tp':>9} {'devices':<14} {'tok/s/blk':>9} {'ms/blk':>7} "
        f"{'sessions':>8} {'cache left':>10}  {'reach':<11} address"
    )
    for r in sorted(records, key=lambda r: (r.start, r.end, r.name)):
        address = describe_address(r)
        print(
            f"  {short_id(r.peer_id):<14} {printable(r.name, 16):<16} {f'{r.start}:{r.end}':<9} {r.role:<7} {state_of(r, silent):<8} "
            f"{describe_tp(r):>9} {printable(describe_devices(r), 14):<14} {r.throughput:>9.0f} {r.decode_ms_per_block:>7.2f} {r.open_sessions:>8} {r.cache_tokens_left:>10}  "
            f"{r.reachability or '-':<11} {address}"
        )
    from hexswarm.swarm.trust.records import block_ranges, online_peers_per_block

    for r in records:
        if r.peer_id in silent:
            print(
                f"  NO ANSWER: {printable(r.name, 16)} ({short_id(r.peer_id)}) announces itself online but "
                f"did not answer a ping from here: {printable(silent[r.peer_id], 160)}"
            )
    answering = [r for r in records if r.peer_id not in silent]
    online = online_peers_per_block(answering, num_blocks)
    missing = [b for b, n in enumerate(online) if n == 0]
    single = [b for b, n in enumerate(online) if n == 1]
    counted = "online peers per block" + (", those that answered" if silent else "")
    print("  coverage: " + " ".join(str(min(n, 9)) for n in online) + f"  ({counted})")
    if missing:
        print(f"  MISSING: blocks {block_ranges(missing)} have no online peer that answers")
    if single:
        print(
            f"  ONE PEER ONLY: blocks {block_ranges(single)}: if it fails they stop, and --verify "
            "cannot check them (a second peer recomputes a step)"
        )
    return not missing


def state_of(record: PeerRecord, silent: dict[str, str]) -> str:
    """The record's state, or 'silent' for one announced online that did not answer a ping."""
    return "silent" if record.peer_id in silent else record.state.value


def print_over_announcers(records: list[PeerRecord], observed: dict) -> None:
    """One line per peer announcing itself over twice as fast as clients observe it."""
    from hexswarm.swarm.trust.speed_reports import over_announced

    for r in records:
        figure = over_announced(r, observed)
        if figure is not None:
            print(
                f"  OVER-ANNOUNCES: {printable(r.name, 16)} ({short_id(r.peer_id)}) announces "
                f"{r.decode_ms_per_block:.3g} ms/blk, {figure.reporters} clients observe "
                f"{figure.ms_per_block:.3g}: planned and routed by what is observed"
            )


def print_reports(reports: list[Report], names: dict[str, str]) -> None:
    """Peers that clients reported for wrong outputs (client/verify.py), most reporters first."""
    by_peer: dict[str, list[Report]] = {}
    for report in reports:
        by_peer.setdefault(report.reported, []).append(report)
    for peer_id, against in sorted(by_peer.items(), key=lambda item: -len(item[1])):
        reporters = {r.reporter for r in against}
        blocks = sorted({f"{r.start}:{r.end}" for r in against})
        tie = " (confirmed by a third peer)" if any(r.tie_breaker for r in against) else ""
        print(
            f"  REPORTED: {short_id(peer_id)} {printable(names.get(peer_id, '?'))} by {len(reporters)} client(s) "
            f"for wrong outputs on blocks {', '.join(blocks)}{tie}"
        )


def describe_address(record: PeerRecord) -> str:
    """Where others reach it: its first address, the relays it is reached through, or why nobody can."""
    if record.reachability == "relayed":
        return "via relay " + ", ".join(short_id(r) for r in record.relays)
    if record.reachability == "unreachable":
        return "nobody could dial it and no relay took it (see its log)"
    return printable(record.addrs[0], ADDRESS_LIMIT) if record.addrs else "-"


def short_id(peer_id: str) -> str:
    """'...' and a peer id's last 11 characters, escaped: enough to tell peers apart in a table."""
    return "..." + printable(peer_id[-11:], 11)


def describe_tp(record: PeerRecord) -> str:
    """'2', or '2/1,2,4' for a peer whose degree the plan chooses: its degree now / those it offers."""
    if not record.tp_choices:
        return str(record.tp)
    return f"{record.tp}/{','.join(map(str, record.tp_choices))}"


def describe_devices(record: PeerRecord) -> str:
    """'2x cuda 80G', 'cpu int8' ...: the device kind, count and memory of a peer's TP ranks, and
    its weight format when quantized."""
    quant = f" {record.quant}" if record.quant != "none" else ""
    if not record.devices:
        return "-" + quant
    first = record.devices[0]
    memory = f" {first.memory_bytes / 2**30:.0f}G" if first.type != "cpu" else ""
    count = f"{len(record.devices)}x " if len(record.devices) > 1 else ""
    return f"{count}{first.type}{memory}{quant}"


def print_plan(coordination: Coordination, records: list[PeerRecord]) -> None:
    """The coordinator and its plan, in two lines."""
    from hexswarm.client.monitor_data import followers
    from hexswarm.swarm.coordinator.records import uncovered_text

    holder, plan = coordination.holder, coordination.plan
    if holder is None:
        auto = sum(r.auto for r in records)
        print(f"  coordinator: none live ({auto} auto peers place themselves by Petals' rule)")
        return
    print(f"  coordinator: {short_id(holder.holder)}")
    if plan is None:
        print("  plan: none yet")
        return
    names = [printable(r.name) for r in followers(coordination, records)]
    auto = sum(r.auto for r in records)
    estimate = (
        f"planned for throughput (no deadline), {plan.throughput_tok_s:.0f} tokens/s saturated"
        if plan.objective == "throughput"
        else f"estimated attainment {plan.attainment:.1%}, {plan.throughput_tok_s:.0f} tokens/s"
    )
    print(
        f"  plan v{plan.version} (inputs {printable(plan.inputs_hash, 16)}): {estimate}; followed by {len(names)}/{auto} auto peers"
        + (f": {', '.join(sorted(names))}" if names else "")
    )
    if plan.missing:
        print(f"  NO PLAN COVERS THE MODEL: {uncovered_text(plan.missing, plan.memory_short_blocks)}")
