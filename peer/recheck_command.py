"""`hexswarm recheck MODEL FILE [--ban]`: re-checks evidence of a lie by recomputing it here.

FILE is an evidence file (swarm/trust/evidence.py) that a client saved when its verification proved
a peer wrong (in the cache folder's evidence/). The command checks that it holds together (the
peer's signature over its commitments, the inputs and output they name), recomputes the
blocks on those inputs with this machine's copy of MODEL, in one pass, and compares. Exit 0
and "PROVEN" when the peer signed a wrong output; with --ban, this machine's clients leave it
out from then on (swarm/trust/bans.py). Exit 1 when the output holds up, 2 when the file is not
valid evidence for MODEL.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hexswarm.swarm.commands import cli_args

LOG_LEVEL = "warning"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_model_argument(parser, positional=True)
    parser.add_argument("file", type=Path, help="an evidence file (the cache folder's evidence/*.msgpack)")
    parser.add_argument(
        "--ban", action="store_true", help="ban the peer on this machine if the lie is proven"
    )


def run(args: argparse.Namespace) -> int:
    cli_args.check_model(args.model)
    import torch

    from hexswarm.peer.blocks import BlockStack
    from hexswarm.swarm.models.model_spec import load_model_spec
    from hexswarm.swarm.trust.bans import add_ban, new_ban
    from hexswarm.swarm.trust.evidence import Evidence, recheck

    spec = load_model_spec(args.model)
    try:
        evidence = Evidence.from_bytes(args.file.read_bytes())
        if evidence.session.model_id != spec.model_id:
            raise ValueError(f"it is about {evidence.session.model_id}, not {spec.model_id}")
        spec.check_range(evidence.session.start, evidence.session.end)
        evidence.check()
    except (OSError, ValueError) as e:
        raise cli_args.UsageError(f"{args.file} is not valid evidence: {e}") from None
    start, end = evidence.session.start, evidence.session.end
    stack = BlockStack.load(spec, start, end, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        outputs = stack(evidence.inputs.to(torch.float32), stack.new_cache("recheck"), 0, start, end)
    result = recheck(evidence, outputs.to(evidence.output.dtype))
    where = f"blocks [{start}:{end}) at tokens [{evidence.first}:{evidence.records[evidence.step].position})"
    if result.agree:
        print(f"NOT PROVEN: peer {evidence.peer_id}'s output for {where} holds up ({result.describe()})")
        return 1
    print(f"PROVEN: peer {evidence.peer_id} signed a wrong output for {where} ({result.describe()})")
    if args.ban:
        add_ban(new_ban(evidence.peer_id, spec.model_id, start, end, f"re-checked evidence {args.file.name}"))
        print("banned on this machine")
    return 0
