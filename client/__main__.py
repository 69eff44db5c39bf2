"""`python -m client`: the same command as `hexswarm generate` (client/generate_command.py),
kept under its older name for the scripts that call it."""

from __future__ import annotations

import sys

from swarm.cli import run_command

if __name__ == "__main__":
    sys.exit(run_command("generate", sys.argv[1:], prog="python -m client"))
