"""What every command's parser shares: one-line usage errors, defaults in help, `--version`,
the log flags, the model and swarm arguments, and argparse types that check a value's range.

`run-peer` and each `hexswarm` verb build their parsers with `new_parser`,
so they answer the same way: `--help` lists every option with its default, `--version` prints
the package version, and a bad value is one line on stderr with exit status 2. A value that can
only be checked once the command runs (a model that does not exist) raises `UsageError`, which
the commands turn into the same one line and status.

This module imports nothing heavy: `--help` must not wait for torch or hivemind.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, QUANT_FORMATS
from hexswarm.swarm import __version__
from hexswarm.swarm.net.maddrs import initial_peer_problem
from hexswarm.swarm.tools import log_setup

MODEL_HELP = (
    "a built-in model name (hexswarm models), a GGUF file or a checkpoint folder (config.json + safetensors)"
)


class UsageError(Exception):
    """A bad value found after parsing: the command prints it as one line and exits 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (with where to find help), not the usage,
    and which names a mistyped flag (with its closest match) before it says what is missing."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        unknown = self._unknown_flag(args)
        if unknown is not None:
            self.error(unknown)
        return super().parse_known_args(args, namespace)

    def _unknown_flag(self, args: list[str]) -> str | None:
        """What to say of the first --flag this parser does not know (nor abbreviates), if any:
        argparse would report "arguments are required" first, hiding the typo that caused it."""
        known = [s for s in self._option_string_actions if s.startswith("--")]
        for arg in args:
            if arg == "--":
                return None
            if not arg.startswith("--"):
                continue
            flag = arg.split("=", 1)[0]
            if flag in known or any(k.startswith(flag) for k in known):
                continue
            close = difflib.get_close_matches(flag, known, n=1)
            return f"unrecognized argument {flag}" + (f": did you mean {close[0]}?" if close else "")
        return None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default after its help, unless the help already says it or there is
    none to show (an unset value, an off switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default is argparse.SUPPRESS
        if "default" in text or unset or (isinstance(default, str | list | tuple) and not default):
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        """N for a count, X for a number, F for a fraction, PORT: shorter than the flag's name."""
        return getattr(action.type, "metavar", None) or action.dest.upper()


def new_parser(prog: str, description: str | None, log_default: str = "info") -> Parser:
    """A parser with --version and the log flags (-v, -q, --log-level) every command takes."""
    parser = Parser(prog=prog, description=description, formatter_class=HelpFormatter)
    add_version(parser)
    log_setup.add_log_arguments(parser, default=log_default)
    return parser


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version", action="version", version=f"hexswarm {__version__}", help="print the version and exit"
    )


def usage_error(prog: str, message: str) -> int:
    """Prints a usage error in the parser's one-line form; the exit status to return."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def add_model_argument(
    parser: argparse.ArgumentParser, *, positional: bool = False, required: bool = True
) -> None:
    """MODEL (run-peer, generate) or --model (the other commands): always the same three forms."""
    if positional:
        parser.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    elif required:
        parser.add_argument("--model", required=True, help=MODEL_HELP)
    else:
        parser.add_argument(
            "--model", default=None, help=f"only this model: {MODEL_HELP} (default: every model)"
        )


def add_initial_peers(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The swarm to join: --initial-peers (a private swarm) or --public, one of them required
    wherever a command joins a swarm. --public sets `initial_peers` to the public list."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument(
        "--initial-peers",
        nargs="+",
        default=[],
        type=initial_peer,
        metavar="MADDR",
        help="multiaddrs of swarm members to join through, e.g. what `hexswarm bootstrap` prints",
    )
    group.add_argument(
        "--public",
        action=PublicSwarm,
        help="join the public swarm through the bootstrap list shipped with hexswarm "
        "(or HEXSWARM_INITIAL_PEERS), with the public defaults (docs/operations.md)",
    )
    parser.set_defaults(public=False)


def initial_peer(text: str) -> str:
    """An --initial-peers value, if it looks like a multiaddr with a peer id (swarm/net/maddrs.py)."""
    problem = initial_peer_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def layer_range(text: str) -> str:
    """--layers A:B or auto, checked for form and order before the model is read (that takes
    seconds); whether B fits the model is checked once it is."""
    if text == "auto":
        return text
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must look like A:B (blocks A to B-1) or auto, got {text!r}"
        ) from None
    if start < 0:
        raise argparse.ArgumentTypeError(f"{text}: the first block is 0 or more")
    if start >= end:
        raise argparse.ArgumentTypeError(
            f"{text} is an empty or reversed range: A:B serves blocks A to B-1, e.g. {min(start, end)}:{max(start, end) or 1}"
        )
    return text


class PublicSwarm(argparse.Action):
    """--public: the shipped list of bootstrap peers; one line and exit 2 when it is empty
    (except where an empty list is allowed: the first bootstrap of a public swarm)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from hexswarm.swarm.net.dht import NO_PUBLIC_PEERS, public_initial_peers

        peers = public_initial_peers()
        if not peers and not getattr(namespace, "empty_public_list_ok", False):
            parser.error(f"--public: {NO_PUBLIC_PEERS}")
        namespace.initial_peers, namespace.public = peers, True


def add_client_quant(parser: argparse.ArgumentParser) -> None:
    """--quant of a command that generates as a client (api, generate): the formats it accepts."""
    parser.add_argument(
        "--quant",
        nargs="+",
        default=[DEFAULT_QUANT],
        choices=QUANT_FORMATS,
        metavar="FORMAT",
        help=f"weight formats of peers to route through, of {', '.join(QUANT_FORMATS)} (default: none, "
        "the model exactly; e.g. --quant none int8 also uses int8 peers)",
    )


# The share of hop steps a witness recomputes on a --public client unless --verify says otherwise
# (client/verify.py; docs/reliability.md measures its cost).
PUBLIC_VERIFY_RATE = 0.05


def verify_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share of steps in [0, 1], got {text!r}")
    return rate


def add_client_verify(parser: argparse.ArgumentParser) -> None:
    """--verify RATE of a command that generates as a client (api, generate)."""
    parser.add_argument(
        "--verify",
        type=verify_rate,
        default=None,
        metavar="RATE",
        help="check what peers compute: at this share of hop steps, a second peer recomputes the "
        "steps not checked yet, and the rest before a generation returns "
        f"(default: {PUBLIC_VERIFY_RATE} with --public, else 0; docs/reliability.md)",
    )
    parser.add_argument(
        "--verify-min-compared",
        type=fraction,
        default=None,
        metavar="SHARE",
        help="with --verify, fail (exit 1; the API answers an error) when less than this share of "
        "some span's steps could be compared, e.g. because no second peer serves it; 0 accepts "
        "unchecked output (default: at least one comparison per span)",
    )
    parser.add_argument(
        "--accept-unsettled",
        action="store_true",
        help="with --verify, give output on which a server and its witness disagreed and no third "
        "peer settled who was right (default: an error that names them; exit 1)",
    )


def client_verify(args: argparse.Namespace) -> float:
    """The --verify rate asked, or the default of the swarm joined."""
    if args.verify is not None:
        return args.verify
    return PUBLIC_VERIFY_RATE if getattr(args, "public", False) else 0.0


def add_client_host_maddrs(parser: argparse.ArgumentParser) -> None:
    """--host-maddrs of a command that reads the swarm as a client (api, monitor)."""
    parser.add_argument(
        "--host-maddrs",
        nargs="+",
        default=None,
        metavar="MADDR",
        help="p2p addresses to listen on (default: none; this client only dials out and asks no router for a port)",
    )


def check_model(model: str) -> None:
    """Raises UsageError unless `model` names a model in one of the three forms. Cheap: reads
    no weights (loading the model later reports what is wrong inside it, in one line too)."""
    from hexswarm.swarm.models.builtin_models import BUILTIN_MODELS, BuiltinModelMissing, resolve_builtin

    if model in BUILTIN_MODELS:
        try:
            resolve_builtin(model)
        except BuiltinModelMissing as e:
            raise UsageError(str(e)) from None
        return
    path = Path(model).expanduser()
    if path.is_file():
        return
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{model} has no config.json: not a checkpoint folder")
        return
    raise UsageError(
        f"model {model!r} is not a built-in name ({', '.join(BUILTIN_MODELS)}), a GGUF file or a checkpoint folder"
    )


def model_identity(model: str) -> tuple[str, int]:
    """(model id, number of blocks) of a model named on the command line; UsageError if it is none."""
    check_model(model)
    from hexswarm.swarm.models.model_spec import ModelSpecError
    from hexswarm.swarm.models.model_spec import model_identity as identity

    try:
        return identity(model)
    except (ModelSpecError, OSError) as e:
        raise UsageError(str(e)) from None


def hidden_alias(parser: argparse.ArgumentParser, old: str, new: str, type: Callable) -> None:
    """`old` keeps working as a hidden spelling of `new` (a renamed flag; scripts still use it)."""
    dest = new.lstrip("-").replace("-", "_")
    parser.add_argument(old, dest=dest, type=type, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


# argparse types: each returns the value or raises ArgumentTypeError, which the parser prints
# as `prog: error: argument --flag: must be ...` with exit status 2.


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if value != value or value in (float("inf"), float("-inf")):  # NaN, infinities
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _ranged(name: str, kind: type, allowed: Callable[[int | float], bool], rule: str, metavar: str):
    """An argparse type: a `kind` number for which `allowed` holds, else `rule` as the error.
    `metavar` stands for its value in --help (HelpFormatter reads it)."""

    def parse(text: str) -> int | float:
        value = _number(text, kind)
        if not allowed(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text}")
        return value

    parse.__name__, parse.metavar = name, metavar
    return parse


positive_int = _ranged("positive_int", int, lambda v: v >= 1, "must be at least 1", "N")
non_negative_int = _ranged("non_negative_int", int, lambda v: v >= 0, "must not be negative", "N")
positive_float = _ranged("positive_float", float, lambda v: v > 0, "must be positive", "X")
non_negative_float = _ranged("non_negative_float", float, lambda v: v >= 0, "must not be negative", "X")
fraction = _ranged("fraction", float, lambda v: 0 <= v <= 1, "must be in [0, 1]", "F")
port = _ranged("port", int, lambda v: 1 <= v <= 65535, "must be a TCP port in 1..65535", "PORT")


def auto_or(parse: Callable[[str], int | float]) -> Callable[[str], int | float | None]:
    """'auto' (None: decided at run time) or what `parse` accepts."""

    def parse_auto(text: str) -> int | float | None:
        return None if text == "auto" else parse(text)

    parse_auto.__name__ = f"auto or {parse.__name__}"
    return parse_auto


def add_relay_limits(g) -> None:
    """What a reachable node relays for peers behind NAT (swarm/nat/port_relay.py RelayLimits)."""
    from hexswarm.swarm.nat.relay_limits import RelayLimits

    limits = RelayLimits()
    g.add_argument(
        "--relay-max-slots",
        type=positive_int,
        default=limits.max_slots,
        help="peers behind NAT relayed at once",
    )
    g.add_argument(
        "--relay-max-slots-per-group",
        type=positive_int,
        default=limits.max_slots_per_group,
        help="peers behind NAT relayed at once from one IP group (/24 of IPv4, /48 of IPv6)",
    )
    g.add_argument(
        "--relay-max-connections",
        type=positive_int,
        default=limits.max_connections,
        help="connections open at once to each relayed peer",
    )
    g.add_argument(
        "--relay-max-connections-per-group",
        type=positive_int,
        default=limits.max_connections_per_group,
        help="connections open at once to each relayed peer from one IP group (/24 of IPv4, /48 of IPv6)",
    )
    g.add_argument(
        "--relay-data-limit-gb",
        type=positive_float,
        default=limits.data_limit_bytes / 2**30,
        help="GiB one relayed connection may carry each way before it is closed",
    )
    g.add_argument(
        "--relay-time-limit-min",
        type=positive_float,
        default=limits.time_limit_s / 60,
        help="minutes one relayed connection may last before it is closed",
    )


def relay_limits(args):
    from hexswarm.swarm.nat.relay_limits import RelayLimits

    return RelayLimits(
        max_slots=args.relay_max_slots,
        max_slots_per_group=args.relay_max_slots_per_group,
        max_connections=args.relay_max_connections,
        max_connections_per_group=args.relay_max_connections_per_group,
        data_limit_bytes=int(args.relay_data_limit_gb * 2**30),
        time_limit_s=args.relay_time_limit_min * 60,
    )
