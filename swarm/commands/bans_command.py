"""`hexswarm bans`: the peers this machine banned, and lifting a ban.

A ban is written when this machine proved a peer signed a wrong output (its client's own
verification, evidence a peer re-checked, `hexswarm recheck --ban`; swarm/trust/bans.py) and
lasts BAN_TTL_S. An operator who knows better (the peer's operator fixed a broken GPU, or the
proof was wrong) lifts it here: a running peer on this machine stops refusing that peer within
BANS_REFRESH_S (it reads the file again), a client (`generate`, `api`) from its next start.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from hexswarm.swarm.trust.bans import BAN_TTL_S, BANS_REFRESH_S, bans_path, lift_ban, load_bans


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lift",
        metavar="PEER_ID",
        help=f"remove the ban of PEER_ID (a running peer here follows within {BANS_REFRESH_S:g} s)",
    )
    parser.add_argument("--json", action="store_true", help="print the bans as JSON data")


def run(args: argparse.Namespace) -> int:
    path = bans_path()
    if args.lift is not None:
        try:
            lifted = lift_ban(args.lift, path)
        except OSError as e:
            print(f"could not change {path}: {e}", file=sys.stderr)
            return 1
        if lifted is None:
            print(f"no ban of {args.lift} in {path}", file=sys.stderr)
            return 1
        print(f"lifted the ban of {args.lift} ({lifted.reason})")
        return 0
    bans = sorted(load_bans(path).values(), key=lambda b: b.time)
    if args.json:
        rows = [{**asdict(b), "blocks": [b.start, b.end], "expires": b.time + BAN_TTL_S} for b in bans]
        print(json.dumps({"path": str(path), "bans": rows}, indent=2))
        return 0
    if not bans:
        print(f"no bans in {path}")
        return 0
    for ban in bans:
        print(
            f"{ban.peer_id}  banned {_when(ban.time)}, expires {_when(ban.time + BAN_TTL_S)}\n"
            f"    {ban.model_id} blocks [{ban.start}:{ban.end}): {ban.reason}"
        )
    return 0


def _when(unix_time: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(unix_time))
