"""`python -m hexswarm`: the `hexswarm` command (swarm/commands/cli.py)."""

import sys

from hexswarm.swarm.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
