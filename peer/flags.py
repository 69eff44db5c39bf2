"""`run-peer`'s own flags; peer/cli.py adds the coordinator's (swarm/coordinator/command.py) and
runs them. Nothing here imports anything heavy, so `run-peer --help` answers at once; every
value is range-checked by the parser (exit status 2, one line).

The defaults of the admission and batching flags are written out here rather than read from
`AdmissionLimits` and `BatchPolicy`, whose modules load torch; tests/unit/test_cli.py checks
that both agree.
"""

from __future__ import annotations

import argparse

from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, QUANT_FORMATS
from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.net.dht import DEFAULT_HOST_MADDRS

DTYPES = ("float32", "bfloat16", "float16")


# How a --debug-corrupt-outputs peer lies (the attacks of benchmarks/verify.py)
LIES = {
    "noise5": "Gaussian noise at 5% of the output's standard deviation, on every step",
    "noise": "Gaussian noise at 1% of each token's RMS, on every step",
    "sometimes": "Gaussian noise at 1% of each token's RMS, on one step in 20 (at random)",
    "skip-layer": "the middle block of its range not run",
    "finetune": "the middle block's weights perturbed by 1% of their RMS (a fine-tune)",
}


def peer_parser() -> argparse.ArgumentParser:
    """The parser of run-peer's own flags, the hidden --debug-* ones included."""
    p = cli_args.new_parser("run-peer", "Serve a range of a model's transformer layers to the swarm.")
    cli_args.add_model_argument(p, positional=True)
    _placement(p.add_argument_group("layers and placement"))
    _swarm(p.add_argument_group("swarm and network"))
    _devices(p.add_argument_group("devices and tensor parallelism"))
    _limits(p.add_argument_group("sessions and limits"))
    _announcing(p.add_argument_group("announcing and shutdown"))
    _batching(p.add_argument_group("batching"))
    add_debug_arguments(p)
    return p


def _placement(g) -> None:
    g.add_argument(
        "--layers",
        required=True,
        type=cli_args.layer_range,
        help="blocks to serve, A:B for [A, B) (never moved), or auto: the coordinator's plan "
        "(or, with no coordinator, Petals' rule) chooses and may move them",
    )
    g.add_argument(
        "--max-blocks",
        type=cli_args.non_negative_int,
        default=0,
        help="with --layers auto: most blocks to hold (default: 0, no limit)",
    )
    g.add_argument("--region", default="", help="a region label for the coordinator (default: inferred)")
    g.add_argument(
        "--rebalance-period",
        type=cli_args.positive_float,
        default=60.0,
        help="seconds between Petals' rule checks (no coordinator)",
    )
    g.add_argument(
        "--move-wait",
        type=cli_args.non_negative_float,
        default=30.0,
        help="longest a move waits for its old range to be covered (seconds)",
    )
    g.add_argument(
        "--coordinator",
        action="store_true",
        help="also run a coordinator candidate for this model in this peer (flags below)",
    )


def _swarm(g) -> None:
    cli_args.add_initial_peers(g)
    g.add_argument(
        "--host-maddrs",
        nargs="+",
        default=list(DEFAULT_HOST_MADDRS),
        metavar="MADDR",
        help="multiaddrs to listen on",
    )
    g.add_argument(
        "--announce-maddrs",
        nargs="+",
        default=[],
        metavar="MADDR",
        help="public multiaddrs to tell others (a forwarded port, docker); a dial-back checks them",
    )
    g.add_argument(
        "--reachability",
        choices=("auto", "direct", "relayed"),
        default="auto",
        help="auto: reachable nodes dial this peer back at start, and behind NAT it serves through "
        "relays; direct: trust that others can dial it (no check); relayed: use relays without a check",
    )
    cli_args.add_relay_limits(g)
    g.add_argument(
        "--identity",
        default=None,
        help="identity key file (created if missing): a stable peer id (default: a new id each start)",
    )
    g.add_argument(
        "--name",
        default=None,
        help="a human-friendly name shown in status (default: host name and peer-id suffix)",
    )


def _devices(g) -> None:
    g.add_argument("--device", default="auto", help="cpu, cuda or cuda:N; auto: cuda if present, else cpu")
    g.add_argument(
        "--tp",
        type=cli_args.auto_or(cli_args.positive_int),
        default=1,
        metavar="auto|K",
        help="tensor-parallel degree: split every layer over K ranks, one process per device "
        "(auto: one rank per device of --devices; with --layers auto the plan chooses the degree)",
    )
    g.add_argument(
        "--devices",
        default=None,
        help="device of each rank, e.g. cuda:0,cuda:1 or cpu,cpu (default: cuda:0..K-1 on GPU, else cpu x K)",
    )
    g.add_argument(
        "--partition",
        default="even",
        choices=("even", "auto"),
        help="how --tp K splits each layer: even (1/K of the heads and MLP columns each) or auto "
        "(Hepti: every rank is profiled at start, a linear program sizes each rank's share by its "
        "speed, free memory and link, and the group re-splits when observed step times drift)",
    )
    g.add_argument(
        "--tp-timeout",
        type=cli_args.positive_float,
        default=30.0,
        help="seconds any collective may take and a rank may stay silent before the group is declared failed",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPES],
        help="compute dtype; auto: the checkpoint's on GPU, float32 on CPU",
    )
    g.add_argument(
        "--role",
        default="both",
        choices=("both", "prefill", "decode", "auto"),
        help="what clients send here: both (whole requests), prefill (prompts, whose keys and values "
        "go on to decode peers) or decode (HexGen-2's disaggregated serving; docs/architecture.md); "
        "auto: the role a --disaggregated coordinator's plan gives it (with --layers auto)",
    )
    g.add_argument(
        "--quant",
        default=DEFAULT_QUANT,
        choices=QUANT_FORMATS,
        help="weight format of the blocks' linear layers: int8 (weight-only, per channel; CPU and GPU) "
        "or nf4 (4-bit NormalFloat, bitsandbytes); each block is quantized as it loads, and only "
        "clients that accept the format route through this peer",
    )
    g.add_argument(
        "--threads",
        type=cli_args.positive_int,
        default=None,
        help="torch compute threads (default on CPU: 1 for models whose hidden x intermediate size "
        "is under 1M, else the cores this process may use)",
    )


def _limits(g) -> None:
    g.add_argument(
        "--max-sessions", type=cli_args.positive_int, default=16, help="concurrent inference sessions"
    )
    g.add_argument(
        "--max-length",
        type=cli_args.positive_int,
        default=2048,
        help="longest sequence a session may reach (tokens)",
    )
    g.add_argument(
        "--max-sequences-per-session",
        type=cli_args.positive_int,
        default=16,
        help="most sequences one session may carry (its batch size); was --max-batch",
    )
    cli_args.hidden_alias(g, "--max-batch", "--max-sequences-per-session", cli_args.positive_int)
    g.add_argument(
        "--cache-tokens",
        type=cli_args.positive_int,
        default=None,
        help="KV-cache budget in tokens over all sessions (default: --max-sessions x --max-length, "
        "as far as the memory beside the weights, in their --quant format, holds it)",
    )
    g.add_argument(
        "--max-session-cache-tokens",
        type=cli_args.positive_int,
        default=None,
        help="most KV-cache tokens one session may reserve (default: a quarter of --cache-tokens, "
        "at least --max-length)",
    )
    g.add_argument(
        "--cache-share-per-peer",
        type=cli_args.fraction,
        default=0.5,
        help="share of the KV cache one remote peer id's sessions may reserve together (0: no limit)",
    )
    g.add_argument(
        "--max-sessions-per-peer",
        type=cli_args.non_negative_int,
        default=8,
        help="open sessions one remote peer id may hold here (0: no limit)",
    )
    g.add_argument(
        "--ip-group-share",
        type=cli_args.non_negative_float,
        default=2.0,
        help="what one IP group (a /24 or /48) may hold here, in remotes' shares of streams, sessions "
        "and cache: many identities on one address share it (loopback has no group; 0: no group limits)",
    )
    g.add_argument(
        "--max-steps-per-second",
        type=cli_args.non_negative_float,
        default=100.0,
        help="steps per second one session may send, with 2 s of burst (0: no limit)",
    )
    g.add_argument(
        "--session-idle-timeout",
        type=cli_args.positive_float,
        default=300.0,
        help="seconds before an idle session is freed",
    )
    g.add_argument(
        "--handshake-timeout",
        type=cli_args.positive_float,
        default=30.0,
        help="seconds a stream may stay open before it opens a session",
    )
    g.add_argument(
        "--max-frame-mb", type=cli_args.positive_float, default=64.0, help="largest frame accepted (MiB)"
    )
    g.add_argument(
        "--max-buffered-mb",
        type=cli_args.positive_float,
        default=1024.0,
        help="frames held at once over all streams (MiB); a frame that would go over is refused "
        "BUSY from its length prefix, before it is read",
    )


def _announcing(g) -> None:
    g.add_argument(
        "--announce-period",
        type=cli_args.positive_float,
        default=15.0,
        help="seconds between DHT record refreshes (and link probes)",
    )
    g.add_argument(
        "--drain-timeout",
        type=cli_args.non_negative_float,
        default=30.0,
        help="seconds open sessions get to finish on exit",
    )
    g.add_argument(
        "--throughput",
        type=cli_args.auto_or(cli_args.positive_float),
        default=None,
        metavar="auto|TOKENS_PER_S",
        help="announce this prefill throughput (tokens/s per block) instead of measuring it, "
        "e.g. to draw less traffic (default: auto, measured)",
    )
    g.add_argument(
        "--decode-ms",
        type=cli_args.auto_or(cli_args.positive_float),
        default=None,
        metavar="auto|MS",
        help="announce this decode time (ms per block) instead of measuring it (default: auto, measured)",
    )


def _batching(g) -> None:
    g.add_argument(
        "--batch-window-ms",
        type=cli_args.non_negative_float,
        default=2.0,
        help="longest wait for other sessions' decode steps to join a batch (ms); a batch runs "
        "at once when every open session has a step waiting",
    )
    g.add_argument(
        "--max-batch-sequences",
        type=cli_args.positive_int,
        default=64,
        help="most sequences (one decode row each, over all sessions) in one batched forward; "
        "was --max-batch-tokens",
    )
    cli_args.hidden_alias(g, "--max-batch-tokens", "--max-batch-sequences", cli_args.positive_int)
    g.add_argument(
        "--prefill-chunk-tokens",
        type=cli_args.non_negative_int,
        default=256,
        help="run prompts this many tokens at a time, between other sessions' decode steps (0: whole)",
    )
    g.add_argument(
        "--interleave-ratio",
        type=cli_args.non_negative_float,
        default=1.0,
        help="while other sessions decode, size prompt chunks to take about this many times a "
        "decode batch's time (at least 16 tokens; 0: always --prefill-chunk-tokens)",
    )
    g.add_argument(
        "--align-ratio",
        type=cli_args.non_negative_float,
        default=0.0,
        help="while other sessions decode, wait up to this many times a decode batch's time for "
        "their next steps, so they run in one batch (0: only --batch-window-ms; pays on a peer "
        "serving the whole model, not on a chain of a few peers)",
    )
    # every step on its own, in arrival order: the baseline of benchmarks/concurrency.py
    g.add_argument("--no-batching", action="store_true", help=argparse.SUPPRESS)


def add_debug_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden --debug-* flags of the failover, chaos and hostile tests (peer/faults.py, peer/debug.py)."""
    hidden = argparse.SUPPRESS
    parser.add_argument("--debug-fail-after", type=cli_args.non_negative_int, default=None, help=hidden)
    parser.add_argument("--debug-error-rate", type=cli_args.fraction, default=0.0, help=hidden)
    parser.add_argument("--debug-seed", type=int, default=0, help=hidden)
    parser.add_argument("--debug-fault-on-signal", action="store_true", help=hidden)
    parser.add_argument("--debug-fault", choices=["error", "nan"], default="error", help=hidden)
    parser.add_argument(
        "--debug-push", choices=["refuse", "drop", "equivocate", "poison-kv"], default="", help=hidden
    )
    # compute wrong outputs on purpose (peer/debug.py LIES), so tests can check the client's verification
    parser.add_argument(
        "--debug-corrupt-outputs", nargs="?", const="noise5", default="", choices=LIES, help=hidden
    )
    # compute every forward this much slower (peer/debug.py SlowBlocks): a peer slower than it announces
    parser.add_argument("--debug-slow-ms", type=cli_args.non_negative_float, default=0.0, help=hidden)
    # benchmarks/hepti.py: RANK:FACTOR[@SECONDS], that rank computes FACTOR times slower (from then on)
    parser.add_argument("--debug-slowdown", action="append", default=[], help=hidden)
    # announce FIELD=JSON over the honest record (peer/debug.py), so tests can check its readers
    parser.add_argument("--debug-record", action="append", default=[], help=hidden)
