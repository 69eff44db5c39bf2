"""`python -m petals.cli.run_server`, less its start-up version check (runs in the Petals venv).

`run_server` asks the package index for a newer Petals with a `requests.get` that has no timeout;
the private loopback swarm must make no call off this machine, so that check becomes a no-op.
Every command-line argument passes through unchanged.
"""

import petals.utils.version as version

version.validate_version = lambda: None

import petals.cli.run_server as run_server  # noqa: E402 - imported after the patch above

if __name__ == "__main__":
    run_server.main()
