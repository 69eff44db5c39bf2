"""`hexswarm models`: the built-in model names, and the files they stand for on this machine."""

from __future__ import annotations

import argparse
import json

from hexswarm.swarm.models.builtin_models import BUILTIN_MODELS, builtin_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the same as JSON data")


def run(args: argparse.Namespace) -> int:
    rows = [
        {
            "name": model.name,
            "description": model.description,
            "path": str(path) if (path := builtin_path(model)) else None,
            "install": model.install_command,
        }
        for model in BUILTIN_MODELS.values()
    ]
    if args.json:
        print(json.dumps({"models": rows}, indent=2))
        return 0
    for row in rows:
        where = row["path"] or f"not installed: run `{row['install']}`"
        print(f"{row['name']:<14} {row['description']}\n{'':<14} {where}")
    return 0
