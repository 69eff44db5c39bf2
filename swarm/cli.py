"""The `hexswarm` command: one subcommand per module, imported only when used.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. Every
subcommand also takes --quiet and --log-level (swarm/log_setup.py), set up before it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from swarm import log_setup

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "models": ("swarm.models_command", "list the built-in model names and the files they resolve to"),
    "make-tiny-model": ("swarm.tiny_model", "write a small random-initialized checkpoint with a tokenizer"),
    "bootstrap": ("swarm.bootstrap", "start a DHT node that a private swarm joins through"),
    "status": ("client.status", "print the peers of a swarm and the block coverage of each model"),
    "demo": ("swarm.demo", "run a private swarm on this machine and generate text"),
    "plan": ("swarm.coordinator.plan_command", "plan a swarm over a cluster with the HexGen scheduler"),
    "api": ("client.api_command", "serve an OpenAI-compatible HTTP API over the swarm"),
    "coordinator": ("swarm.coordinator.command", "run a coordinator that plans a model's swarm online"),
    "monitor": ("client.monitor", "serve a live web page of the swarm's peers and block coverage"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="hexswarm", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        subparsers.add_parser(name, help=help_text, add_help=False)

    # Parse the command name first, so only the chosen module gets imported (torch is slow to import).
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)
        return 2
    name = argv[0]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sub = argparse.ArgumentParser(prog=f"hexswarm {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(sub)
    log_setup.add_log_arguments(sub)
    args = sub.parse_args(argv[1:])
    log_setup.setup_logging(args, f"hexswarm {name}")
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
