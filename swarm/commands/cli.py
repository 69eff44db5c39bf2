"""The `hexswarm` command: one subcommand per module, imported only when used.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int` (and may set
`LOG_LEVEL`, its default log level). Every subcommand's parser comes from
`swarm.commands.cli_args.new_parser`: --version, -v / --quiet / --log-level (set up before it runs),
defaults in --help, and one line with exit status 2 for a bad value, found by the parser or
raised by `run` as `UsageError`.
"""

from __future__ import annotations

import importlib
import os
import sys

from hexswarm.swarm.commands import cli_args

# subcommand -> (module, one-line help)
from hexswarm.swarm.tools import fast_exit, log_setup

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "models": (
        "hexswarm.swarm.commands.models_command",
        "list the built-in model names and the files they resolve to",
    ),
    "make-tiny-model": (
        "hexswarm.swarm.commands.tiny_model",
        "write a small random-initialized checkpoint with a tokenizer",
    ),
    "bootstrap": ("hexswarm.swarm.commands.bootstrap", "start a DHT node that a private swarm joins through"),
    "status": ("hexswarm.client.status", "print the peers of a swarm and the block coverage of each model"),
    "demo": ("hexswarm.swarm.commands.demo", "run a private swarm on this machine and generate text"),
    "generate": ("hexswarm.client.generate_command", "generate text through a swarm from the shell"),
    "plan": (
        "hexswarm.swarm.coordinator.plan_command",
        "plan a swarm over a cluster with the HexGen scheduler",
    ),
    "api": ("hexswarm.client.api.command", "serve an OpenAI-compatible HTTP API over the swarm"),
    "coordinator": (
        "hexswarm.swarm.coordinator.command",
        "run a coordinator that plans a model's swarm online",
    ),
    "monitor": ("hexswarm.client.monitor", "serve a live web page of the swarm's peers and block coverage"),
    "recheck": (
        "hexswarm.peer.recheck_command",
        "re-check evidence of a peer's lie by recomputing it here",
    ),
    "bans": ("hexswarm.swarm.commands.bans_command", "list the peers this machine banned, or lift a ban"),
}


def main(argv: list[str] | None = None) -> int:
    """The `hexswarm` command. Called as the command (no `argv`), a verb whose module sets
    `EXIT_AT_ONCE` ends the process as soon as it returns (`exit_at_once`)."""
    if argv is None:
        return exit_at_once(_main(sys.argv[1:]), sys.argv[1:2])
    return _main(argv)


def _main(argv: list[str]) -> int:
    parser = cli_args.Parser(
        prog="hexswarm",
        description=__doc__.splitlines()[0] + " Serving a model's layers is `run-peer`.",
        formatter_class=cli_args.HelpFormatter,
    )
    cli_args.add_version(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        subparsers.add_parser(name, help=help_text, add_help=False)

    # Parse the command name first, so only the chosen module gets imported (torch is slow to import).
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # --help, --version, or a usage error
        return 2
    return run_command(argv[0], argv[1:])


def exit_at_once(status: int, verb: list[str]) -> int:
    """Ends the process now if `verb`'s module says it may (`EXIT_AT_ONCE`: it stopped every
    child and thread it started): the interpreter's teardown costs 0.4 s once torch is
    loaded, a fifth of a `hexswarm status`. Returns `status` otherwise."""
    module = sys.modules.get(SUBCOMMANDS[verb[0]][0]) if verb and verb[0] in SUBCOMMANDS else None
    if getattr(module, "EXIT_AT_ONCE", False):
        fast_exit.exit_now(status)
    return status


def build_parser(name: str, prog: str | None = None) -> cli_args.Parser:
    """The parser of the verb `name` (its module imported); `prog` names it in help and errors."""
    module = importlib.import_module(SUBCOMMANDS[name][0])
    parser = cli_args.new_parser(
        prog or f"hexswarm {name}", SUBCOMMANDS[name][1], getattr(module, "LOG_LEVEL", "info")
    )
    module.add_arguments(parser)
    return parser


def run_command(name: str, argv: list[str], prog: str | None = None) -> int:
    """Parses `argv` for the verb `name` and runs it; `prog` names it in help and errors."""
    parser = build_parser(name, prog)
    args = parser.parse_args(argv)
    log_setup.setup_logging(args, parser.prog)
    module = importlib.import_module(SUBCOMMANDS[name][0])  # imported by build_parser already
    if getattr(module, "EXIT_AT_ONCE", False):
        # hivemind shares its futures' state with torch's "file_system" strategy by default, whose
        # daemon (torch_shm_manager) outlives the command by ~2 s holding its stdout and stderr:
        # whoever reads them (a pipe, `$(hexswarm status)`) waited that long after it ended.
        os.environ.setdefault("HIVEMIND_MEMORY_SHARING_STRATEGY", "file_descriptor")
    from hexswarm.swarm.net.dht import InitialPeersError

    try:
        return int(module.run(args) or 0)
    except (cli_args.UsageError, InitialPeersError) as e:
        return cli_args.usage_error(parser.prog, str(e))
    except KeyboardInterrupt:  # Ctrl-C where the verb sets no handler of its own: no traceback
        return 130


if __name__ == "__main__":
    sys.exit(main())
