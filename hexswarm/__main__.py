"""`python -m hexswarm`: the `hexswarm` command (swarm/cli.py)."""

import sys

from hexswarm.swarm.cli import main

if __name__ == "__main__":
    sys.exit(main())
