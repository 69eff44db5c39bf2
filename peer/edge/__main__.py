"""`python -m hexswarm.peer.edge`: the same as the `edge-peer` command."""

import sys

from hexswarm.peer.edge.cli import main

sys.exit(main())
